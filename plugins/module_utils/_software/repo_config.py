# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Which of a node's EL 7 repository files el7_bootstrap rewrites, and why (issue 33).

A working repository configuration is left alone: a file is rewritten to the archive mirror only when it is
absent, when an enabled section still points at a dead mirrorlist/metalink host (CentOS 7's and EPEL 7's
were shut down), or when an enabled section's baseurl did not answer the node's probe (curl of
``<baseurl>/repodata/repomd.xml``, run by the role's raw task). A file in mode ``dead-mirrorlist`` (the SCLo
files while SCL is off) is rewritten only for the dead host, never for an unreachable baseurl: it may be a
site's own file for a repository this run does not use.

The role runs before the node has Python: the node only prints its files and the probes' answers; this runs
on the controller (filter ``llmops.serving.el7_repo_plan``). Plain Python 3.6, standard library only.
"""
from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

DEAD_HOSTS = ("mirrorlist.centos.org", "mirror.centos.org", "mirrors.fedoraproject.org")
_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*\Z")
_OPTION = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*=\s*(.*?)\s*\Z")
_FALSE = ("0", "no", "false", "off")


def sections(text):
    """{section: {option: value}} of a .repo file, as yum reads it (continuation lines of baseurl join it)."""
    out = {}
    current = None
    last = None
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        match = _SECTION.match(line)
        if match:
            current = out.setdefault(match.group(1).strip(), {})
            last = None
            continue
        if current is None:
            continue
        if line[:1].isspace() and last:  # a continuation line (more baseurls)
            current[last] = (current[last] + " " + line.strip()).strip()
            continue
        match = _OPTION.match(line)
        if match:
            last = match.group(1).lower()
            current[last] = match.group(2)
    return out


def enabled(options):
    return options.get("enabled", "1").strip().lower() not in _FALSE


def first_baseurl(options):
    value = options.get("baseurl", "").replace(",", " ").split()
    return value[0] if value else ""


def probe_urls(files):
    """The first baseurl of every enabled section of the files (what the node is asked to probe)."""
    urls = []
    for text in files.values():
        if text is None:
            continue
        for options in sections(text).values():
            url = first_baseurl(options)
            if enabled(options) and url and url not in urls:
                urls.append(url)
    return urls


def _dead(options, dead_hosts):
    for option in ("mirrorlist", "metalink"):
        value = options.get(option, "")
        if any(host in value for host in dead_hosts):
            return "%s=%s" % (option, value)
    return ""


def decide(name, text, mode, answers, dead_hosts=DEAD_HOSTS):
    """(rewrite, reason) for one repository file. text: its content, None when absent; mode: ``write`` or
    ``dead-mirrorlist``; answers: {baseurl: HTTP status from the node's probe, 0 = no answer}."""
    if text is None:
        return True, "%s is absent" % name
    found = sections(text)
    for section, options in sorted(found.items()):
        if not enabled(options):
            continue
        dead = _dead(options, dead_hosts)
        if dead:
            return True, "%s [%s] uses %s, which is shut down" % (name, section, dead)
    if mode != "write":
        return False, "%s has no section on a dead mirror list (left as the site wrote it)" % name
    working = []
    for section, options in sorted(found.items()):
        url = first_baseurl(options)
        if not enabled(options) or not url:
            continue
        status = answers.get(url, 0)
        if status != 200:
            what = "no answer" if not status else "HTTP %s" % status
            return True, "%s [%s] baseurl %s failed from the node (%s)" % (name, section, url, what)
        working.append(section)
    if not working:
        return True, "%s has no enabled repository with a baseurl" % name
    return False, "%s answers from the node (%s): left as it is" % (name, ", ".join(working))


def plan(files, modes, answers, dead_hosts=DEAD_HOSTS):
    """[{file, rewrite, reason}] for the managed files (modes: {file: mode}, in the role's order)."""
    out = []
    for name, mode in modes:
        rewrite, reason = decide(name, files.get(name), mode, answers, dead_hosts)
        out.append({"file": name, "rewrite": rewrite, "reason": reason})
    return out


def parse_node_output(stdout):
    """The role's raw read: ``LLMOPS_FILE <name> <present|absent>`` followed by the file's lines and
    ``LLMOPS_END``, then ``LLMOPS_PROBE <status> <url>`` lines. Returns (files, answers)."""
    files = {}
    answers = {}
    current = None
    lines = []
    for line in (stdout or "").splitlines():
        if current is not None:
            if line == "LLMOPS_END":
                files[current] = "\n".join(lines) + "\n"
                current = None
            else:
                lines.append(line)
            continue
        words = line.split(" ", 2)
        if words[0] == "LLMOPS_FILE" and len(words) == 3:
            if words[2] == "present":
                current, lines = words[1], []
            else:
                files[words[1]] = None
        elif words[0] == "LLMOPS_PROBE" and len(words) == 3:
            answers[words[2]] = int(words[1]) if words[1].isdigit() else 0
    return files, answers
