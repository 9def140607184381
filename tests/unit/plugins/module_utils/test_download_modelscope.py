# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download with source: modelscope against the fake hub's ModelScope layout: the file listing gives
sha256 and size, the bytes come from /models/<repo>/resolve/<revision>/, verified, resumable, and the token
(Bearer and the m_session_id cookie) only ever goes to the endpoint's origin."""
import json
import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import options as download_options
from ansible_collections.llmops.serving.plugins.module_utils._download import source as download_source

from tests.fixtures.fake_hub.helpers import (
    MIB,
    MODEL_SIZE,
    TOKEN,
    assert_final_good_or_absent,
    body_bytes,
    dl,
    params,
    quarantined,
    sha256_of,
)
from tests.fixtures.fake_hub.server import FakeHub

SIZE = MODEL_SIZE


def ms_params(hub, dest, **kw):
    return params(hub, dest, source="modelscope", **kw)


def listings(hub):
    return [e for e in hub.requests() if e["path"].startswith("/api/v1/models/")]


def final(dest, name="model.gguf"):
    return os.path.join(str(dest), name)


def test_download_from_modelscope_layout_is_verified_with_the_listing_sha256(hub, dest, model):
    r = dl.run(ms_params(hub, dest))
    assert r["changed"] and r["verified"] == "download" and r["sha256"] == model == sha256_of(r["path"])
    assert r["size"] == SIZE == r["downloaded_bytes"]
    assert r["commit"] == hub.commit("org/m")  # the listing's per-file Revision
    assert r["source_url"].endswith("/models/org/m/resolve/master/model.gguf")
    (listing,) = listings(hub)
    assert listing["method"] == "GET"
    assert listing["path"] == "/api/v1/models/org/m/repo/files?Revision=master&Recursive=true"
    hf_style = [e for e in hub.requests() if e["path"].startswith("/org/")]
    assert hf_style == [] and not [e for e in hub.requests() if e["method"] == "HEAD"]
    side = json.load(open(dl.sidecar_path(r["path"])))
    assert side["sha256"] == model and side["source"]["hub"] == "modelscope"
    assert side["source"]["revision"] == "master"
    hub.reset_stats()
    again = dl.run(ms_params(hub, dest))
    assert not again["changed"] and again["verified"] == "sidecar" and body_bytes(hub) == 0
    assert len(listings(hub)) == 1  # the listing vouches for the record


def test_wrong_sha256_option_is_refused_before_any_byte(hub, dest, model):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(ms_params(hub, dest, sha256="0" * 64))
    assert "differs from the hub's" in e.value.msg and model in e.value.msg
    assert body_bytes(hub) == 0 and not os.path.exists(final(dest))


def test_corrupted_bytes_fail_against_the_listing_sha256_and_are_quarantined(hub, dest, model):
    hub.set_fault("corrupt", offset=12345)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(ms_params(hub, dest, connections=1))
    assert "checksum mismatch" in e.value.msg and model in e.value.msg
    assert not os.path.exists(final(dest)) and len(quarantined(dest)) == 1
    hub.clear_faults()
    r = dl.run(ms_params(hub, dest))
    assert sha256_of(r["path"]) == model


def test_interrupted_download_resumes_from_the_part(hub, dest, model):
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(ms_params(hub, dest, retries=0))
    assert_final_good_or_absent(final(dest), model)
    assert json.load(open(final(dest) + ".part.json"))["done"] == [[0, MIB]]
    hub.reset_stats()
    r = dl.run(ms_params(hub, dest))
    assert r["resumed_from"] == MIB and r["downloaded_bytes"] == SIZE - MIB == body_bytes(hub)
    assert sha256_of(r["path"]) == model


def test_split_set_is_verified_per_part_from_one_listing(hub, dest):
    shas = [hub.add_file("org/m/q/big-%05d-of-00003.gguf" % i, 200000 + i, seed=i) for i in (1, 2, 3)]
    r = dl.run(ms_params(hub, dest, filename="q/big-00001-of-00003.gguf"))
    assert [p["sha256"] for p in r["parts"]] == shas
    assert [sha256_of(p) for p in r["paths"]] == shas
    assert len(listings(hub)) == 1


def test_file_missing_from_the_listing_names_the_default_branch(hub, dest, model):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(ms_params(hub, dest, filename="nope.gguf"))
    assert "not in the file listing" in e.value.msg and "master" in e.value.msg


def test_unknown_revision_is_a_404_with_advice(hub, dest, model):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(ms_params(hub, dest, revision="main"))
    assert "HTTP 404" in e.value.msg and "revision" in e.value.msg


def test_pinned_commit_revision_lists_and_fetches_that_commit(hub, dest, model):
    commit = hub.commit("org/m")
    r = dl.run(ms_params(hub, dest, revision=commit))
    assert r["sha256"] == model and "/resolve/%s/" % commit in r["source_url"]
    assert listings(hub)[0]["path"].endswith("Revision=%s&Recursive=true" % commit)


def test_an_html_page_instead_of_the_listing_is_refused(hub, dest, model):
    hub.set_fault("html")
    with pytest.raises(dl.DownloadError) as e:
        dl.run(ms_params(hub, dest))
    assert "HTML page" in e.value.msg and not os.listdir(str(dest))


@pytest.mark.parametrize("body, words", [
    (b"not json", "is not JSON"),
    (b'{"Code": 10010205001, "Message": "model not found"}', "Code 10010205001: model not found"),
    (b'{"Code": 200, "Data": {}}', "no Data.Files list"),
    (b"[1]", "not a JSON object"),
])
def test_a_listing_that_is_not_one_is_refused(body, words):
    o = {"repo": "org/m", "endpoint": "https://ms.example"}
    with pytest.raises(dl.DownloadError) as e:
        download_source.parse_listing(body, o, "master")
    assert words in e.value.msg


def test_check_mode_reports_the_download_from_the_listing(hub, dest, model):
    r = dl.run(ms_params(hub, dest), check_mode=True)
    assert r["changed"] and r["parts"][0]["action"] == "download" and r["sha256"] == model
    assert body_bytes(hub) == 0 and os.listdir(str(dest)) == []


# ---------------------------------------------------------------------------------------------
# Options: endpoint, revision and token per hub
# ---------------------------------------------------------------------------------------------
def test_modelscope_defaults_and_environment(monkeypatch):
    for var in ("MODELSCOPE_DOMAIN", "MODELSCOPE_API_TOKEN", "HF_ENDPOINT", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    base = {"repo": "org/m", "filename": "m.gguf", "dest": "/srv/models", "source": "modelscope"}
    o = download_options.normalize(base)
    assert o["endpoint"] == "https://www.modelscope.cn" and o["revision"] == "master" and o["token"] is None
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "modelscope.example")
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.com")
    monkeypatch.setenv("HF_TOKEN", "hf_never_to_modelscope")
    o = download_options.normalize(base)
    assert o["endpoint"] == "https://modelscope.example" and o["token"] is None
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-token")
    o = download_options.normalize(base)
    assert o["token"] == "ms-token" and o["token"].cookie_name == "m_session_id"
    hf = download_options.normalize(dict(base, source="huggingface"))
    assert hf["endpoint"] == "https://hf-mirror.com" and hf["revision"] == "main"
    assert hf["token"] == "hf_never_to_modelscope" and getattr(hf["token"], "cookie_name", None) is None


def test_source_modelscope_with_a_plain_url_is_refused():
    with pytest.raises(dl.DownloadError) as e:
        download_options.normalize({"url": "https://x.example/m.gguf", "dest": "/srv/m",
                                    "source": "modelscope"})
    assert "plain url has no hub" in e.value.msg


def test_modelscope_token_from_the_environment_with_a_newline_is_refused(monkeypatch):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-token\n")
    with pytest.raises(dl.DownloadError) as e:
        download_options.normalize({"repo": "org/m", "filename": "m.gguf", "dest": "/srv/m",
                                    "source": "modelscope"})
    assert "MODELSCOPE_API_TOKEN" in e.value.msg and "ms-token" not in e.value.msg


# ---------------------------------------------------------------------------------------------
# Token: Bearer and cookie, to the endpoint's origin only
# ---------------------------------------------------------------------------------------------
def test_gated_repo_without_token_fails_with_advice(hub, dest, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # a Hugging Face token never goes to a ModelScope source
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    hub.add_file("org/gated/model.gguf", SIZE, seed=5)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(ms_params(hub, dest, repo="org/gated"))
    assert "HTTP 401" in e.value.msg and "token" in e.value.msg
    assert not [x for x in hub.requests() if x["auth"] or x["cookie"]]


def test_token_goes_as_bearer_and_cookie_to_the_endpoint_only(tmp_path, hub):
    """The CDN is another port of the same host: it sees neither the Authorization header nor the cookie."""
    gated = FakeHub(hub.state.root, gated=("org/gated",), tokens=(TOKEN,),
                    cdn_host="127.0.0.1:%d" % hub.port).start()
    try:
        sha = gated.add_file("org/gated/model.gguf", SIZE, seed=5)
        r = dl.run(ms_params(gated, tmp_path / "d", repo="org/gated", token=TOKEN))
        assert sha256_of(r["path"]) == sha
        cdn = [e for e in hub.requests() if e["path"].startswith("/cdn/")]
        assert cdn, "the CDN hop was not taken"
        assert [e for e in hub.requests() if e["authorization"] or e["cookie"]] == []
        on_endpoint = [e for e in gated.requests() if not e["path"].startswith("/cdn/")]
        assert on_endpoint and all(e["authorization"] == "Bearer " + TOKEN for e in on_endpoint)
        assert all(e["cookie"] == "m_session_id=" + TOKEN for e in on_endpoint)
        assert TOKEN not in json.dumps(r)
    finally:
        gated.stop()

