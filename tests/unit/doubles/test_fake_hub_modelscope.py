# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake hub's ModelScope layout: the JSON file listing, /models/<repo>/resolve/, master, the cookie."""
import hashlib
import http.client
import json
from urllib.parse import urlsplit

import pytest

from tests.fixtures.fake_hub.server import FakeHub

TOKEN = "ms-fakehubtoken"
LISTING = "/api/v1/models/%s/repo/files?Revision=%s&Recursive=%s"


@pytest.fixture
def hub(tmp_path):
    h = FakeHub(str(tmp_path), gated=("org/gated",), tokens=(TOKEN,)).start()
    h.big = h.add_file("org/m/q/model.gguf", 5000, seed=1)
    h.small = h.add_file("org/m/config.json", 100, seed=2)
    h.add_file("org/gated/model.gguf", 100, seed=3)
    yield h
    h.stop()


def get(hub, path, headers=None, method="GET"):
    u = urlsplit(path if path.startswith("http") else hub.url + path)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    c.request(method, u.path + ("?" + u.query if u.query else ""), headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r, body


def test_recursive_listing_has_sha256_size_and_revision_per_file(hub):
    r, body = get(hub, LISTING % ("org/m", "master", "true"))
    doc = json.loads(body)
    assert r.status == 200 and doc["Code"] == 200
    files = dict((f["Path"], f) for f in doc["Data"]["Files"])
    assert files["q"]["Type"] == "tree"
    big = files["q/model.gguf"]
    assert big["Type"] == "blob" and big["Sha256"] == hub.big and big["Size"] == 5000 and big["IsLFS"]
    assert big["Name"] == "model.gguf" and big["Revision"] == hub.commit("org/m")
    assert files["config.json"]["Sha256"] == hub.small and not files["config.json"]["IsLFS"]
    r, body = get(hub, LISTING % ("org/m", "master", "false"))
    assert sorted(f["Path"] for f in json.loads(body)["Data"]["Files"]) == ["config.json", "q"]


def test_resolve_redirects_big_files_without_hub_headers_and_serves_small_ones(hub):
    r, _ = get(hub, "/models/org/m/resolve/master/q/model.gguf", method="HEAD")
    assert r.status == 302 and "/cdn/org/m/q/model.gguf" in r.getheader("Location")
    assert r.getheader("X-Linked-Etag") is None and r.getheader("X-Repo-Commit") is None
    r, body = get(hub, r.getheader("Location"))
    assert hashlib.sha256(body).hexdigest() == hub.big
    r, body = get(hub, "/models/org/m/resolve/%s/config.json" % hub.commit("org/m"))
    assert r.status == 200 and hashlib.sha256(body).hexdigest() == hub.small


def test_main_is_not_a_modelscope_branch_and_errors_are_json(hub):
    for path in (LISTING % ("org/m", "main", "true"), "/models/org/m/resolve/main/config.json",
                 "/models/org/m/resolve/master/nope.bin", LISTING % ("org/none", "master", "true")):
        r, body = get(hub, path)
        assert r.status == 404 and json.loads(body)["Code"] == 404, path


def test_gated_repo_takes_bearer_or_the_sdk_cookie(hub):
    for headers, status in (({}, 401), ({"Cookie": "m_session_id=" + TOKEN}, 200),
                            ({"Cookie": "other=1; m_session_id=" + TOKEN}, 200),
                            ({"Cookie": "m_session_id=wrong"}, 401),
                            ({"Authorization": "Bearer " + TOKEN}, 200)):
        r, _ = get(hub, LISTING % ("org/gated", "master", "true"), headers)
        assert r.status == status, headers
        r, _ = get(hub, "/models/org/gated/resolve/master/model.gguf", headers)
        assert r.status == status, headers


def test_the_hugging_face_side_still_refuses_the_cookie(hub):
    r, _ = get(hub, "/org/gated/resolve/main/model.gguf", {"Cookie": "m_session_id=" + TOKEN})
    assert r.status == 401
