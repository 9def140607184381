# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The validate report as one HTML page (benchmark_report.html_report, filter benchmark_html, role validate's
task): well formed, self-contained, escaped; and opened in headless Chromium, whose screenshot must show the
chart: the PNG is decoded here (zlib, the PNG filters) and the pixels of each instance's line colour counted,
against the same page without its chart."""
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import benchmark_report as br

from tests.helpers import ROOT, load_yaml, role_templar
from tests.unit.plugins.plugin_utils.test_benchmark_report import report

VOID = {"meta", "br", "img", "hr", "input", "link", "circle", "line", "polyline", "rect", "path"}


class Tags(HTMLParser):
    """Checks that every element is closed in order, and records the elements and attributes seen."""

    def __init__(self):
        HTMLParser.__init__(self)
        self.stack, self.seen, self.attrs = [], [], []

    def handle_starttag(self, tag, attrs):
        self.seen.append(tag)
        self.attrs.extend(attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.seen.append(tag)
        self.attrs.extend(attrs)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack)
        self.stack.pop()


def parse(text):
    tags = Tags()
    tags.feed(text)
    tags.close()
    assert tags.stack == []
    return tags


def test_the_page_is_well_formed_self_contained_and_carries_the_chart_and_tables():
    text = br.html_report(report())
    assert text.startswith("<!DOCTYPE html>\n") and "<?xml" not in text
    tags = parse(text)
    assert tags.seen.count("svg") == 1 and tags.seen.count("polyline") == 4       # 2 panels x 2 instances
    assert tags.seen.count("table") == 2 and tags.seen.count("h2") == 2
    assert not [a for a in tags.attrs if a[0] in ("src", "href")], "nothing outside the page"
    assert "<td>13.090</td>" in text and "HTTP 500: CUDA out of memory" in text


def test_names_and_settings_are_escaped():
    hostile = report()
    hostile["host"] = "<script>alert(1)</script>"
    hostile["instances"]["qwen-fp8"]["settings"] = {"x": "</code><img src=x onerror=alert(1)>"}
    text = br.html_report(hostile)
    assert "<script>" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    parse(text)


def test_role_validate_writes_the_page_with_the_other_reports(tmp_path):
    """The page is one of the report files role validate writes on the controller (report_files: only when
    missing or different, like the JSON, Markdown and chart)."""
    task = next(t for t in load_yaml(os.path.join(ROOT, "roles", "validate", "tasks", "report.yml"))
                if t["name"].startswith("List the controller's report files"))
    templar = role_templar(os.path.join(ROOT, "roles", "validate"),
                           {"_validate_report": report(), "inventory_hostname": "node1",
                            "validate_report_dir": str(tmp_path)})
    files = templar.template(task["ansible.builtin.set_fact"]["_validate_report_stale"])
    assert {"name": "node1.html", "content": br.html_report(report())} in files


# --- the page in a browser ---------------------------------------------------------------------------------

def png_pixels(data):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG: chunks, zlib, the five
    scanline filters of the PNG specification."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks, header = 8, [], None
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        body = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        offset += 12 + length
    width, height, depth, colour, _comp, _filter, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        previous = line
    return width, height, rows


def screenshot(tmp_path, name, text):
    page = tmp_path / (name + ".html")
    page.write_text(text)
    png = tmp_path / (name + ".png")
    proc = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--force-device-scale-factor=1", "--window-size=900,640",
                           "--screenshot=%s" % png, page.as_uri()],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=120, check=False)
    assert proc.returncode == 0 and png.exists(), proc.stdout[-2000:]
    return png_pixels(png.read_bytes())


def count(rows, rgb):
    return sum(1 for row in rows for pixel in row if pixel == rgb)


def rgb(colour):
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium (Debian package) is not installed")
def test_headless_chromium_shows_the_chart_of_each_instance(tmp_path):
    text = br.html_report(report())
    width, height, rows = screenshot(tmp_path, "report", text)
    assert (width, height) == (900, 640)
    lines = {name: rgb(br.COLOURS[i]) for i, name in enumerate(sorted(report()["instances"]))}
    shown = {name: count(rows, colour) for name, colour in lines.items()}
    # Each line crosses both panels (2 px wide, a few hundred px long) plus its legend swatch and dots.
    print("pixels of each instance's line colour:", shown)
    assert all(pixels > 100 for pixels in shown.values()), shown
    # The same page without its chart: the colours are the chart's, not the page's.
    bare = re.sub(r"<svg.*?</svg>", "", text, flags=re.S)
    _w, _h, rows = screenshot(tmp_path, "bare", bare)
    assert {name: count(rows, colour) for name, colour in lines.items()} == {name: 0 for name in lines}
