# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download never loses a verified model (GitHub issue 23): a source that claims nothing verifiable, a
hub that states another sha256 or size for the same commit, a size claim that disagrees with a matching
sha256, quarantined copies, split sets at one commit, sidecar records forged by the service user, messages
that say where each file went, impossible sizes, and a signed URL's query string in the module's output."""
import json
import os
import stat

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import options as download_options
from ansible_collections.llmops.serving.plugins.module_utils._download.sidecar import recorded_sha256

from tests.fixtures.fake_hub.helpers import (
    MODEL_SIZE,
    body_bytes,
    dl,
    params,
    quarantined,
    sha256_of,
)
from tests.helpers import run_module_file

SIZE = MODEL_SIZE
SERVICE_UID = 65534  # "nobody": stands in for the service user who can write the models directory
OTHER_SHA = "f" * 64


def final(dest, name="model.gguf"):
    return os.path.join(str(dest), name)


def place(hub, dest, data=None):
    """A file put at the final path by hand (no sidecar record): the hub's bytes, or ``data``."""
    if data is None:
        with open(os.path.join(hub.state.root, "org", "m", "model.gguf"), "rb") as f:
            data = f.read()
    with open(final(dest), "wb") as f:
        f.write(data)
    return sha256_of(final(dest))


def listing(dest):
    return sorted(n for n in os.listdir(str(dest)) if not n.endswith(".llmops.lock"))


# =============================================================================================
# A source that claims nothing verifiable
# =============================================================================================
@pytest.mark.parametrize("update", [False, True])
def test_an_empty_200_from_the_mirror_never_replaces_a_verified_model(hub, dest, model, update):
    dl.run(params(hub, dest))
    hub.set_fault("empty")
    r = dl.run(params(hub, dest, update=update))
    assert sha256_of(final(dest)) == model and os.path.getsize(final(dest)) == SIZE
    assert not r["changed"] and r["sha256"] == model and r["size"] == SIZE
    assert "0 bytes and no sha256" in r["msg"] and "kept the verified file" in r["msg"], r["msg"]
    assert r["warnings"] and quarantined(dest) == []


def test_an_empty_200_leaves_a_file_placed_by_hand_alone(hub, dest, model):
    sha = place(hub, dest)
    hub.set_fault("empty")
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    msg = e.value.msg
    assert final(dest) in msg and "left untouched" in msg and "sha256" in msg, msg
    assert sha256_of(final(dest)) == sha and quarantined(dest) == []
    assert listing(dest) == ["model.gguf"]


def test_a_modelscope_listing_entry_of_size_0_never_replaces_a_verified_model(hub, dest, model):
    p = params(hub, dest, source="modelscope")
    dl.run(p)
    hub.set_fault("claim", size=0, sha256="")
    r = dl.run(dict(p, update=True))
    assert sha256_of(final(dest)) == model and not r["changed"]
    assert "kept the verified file" in r["msg"] and quarantined(dest) == []


def test_a_new_commit_that_states_0_bytes_and_no_sha256_never_replaces_a_verified_model(hub, dest, model):
    """The other direction of the size-0 rule: the source moved (a new commit) and ``update: true`` asks for
    it, but the new commit's claim (0 bytes, no sha256) vouches for nothing: the verified model stays."""
    first = dl.run(params(hub, dest))["commit"]
    new = hub.move_main("org/m")
    hub.set_fault("claim", size=0, sha256="")
    hub.reset_stats()
    r = dl.run(params(hub, dest, update=True))
    assert sha256_of(final(dest)) == model and os.path.getsize(final(dest)) == SIZE
    assert not r["changed"] and r["sha256"] == model and r["size"] == SIZE and r["commit"] == first
    assert new in r["msg"] and "0 bytes and no sha256" in r["msg"] and r["warnings"], r["msg"]
    assert body_bytes(hub) == 0 and quarantined(dest) == []
    assert recorded_sha256(final(dest)) == model


# =============================================================================================
# A hub that states another sha256 or size for the same commit
# =============================================================================================
def test_another_sha256_for_the_same_commit_is_checked_and_never_replaces_the_model(hub, dest, model):
    """The hub contradicts the record: the record is not trusted, the file is hashed, and since it is not
    what the hub states it is downloaded again; the hub's bytes do not match its own claim either, so
    nothing replaces the model (quarantined, the run fails saying what the final path holds)."""
    dl.run(params(hub, dest))
    hub.set_fault("claim", sha256=OTHER_SHA)
    for run in range(2):  # retried AWX jobs
        with pytest.raises(dl.DownloadError) as e:
            dl.run(params(hub, dest))
        msg = e.value.msg
        assert "checksum mismatch" in msg and OTHER_SHA in msg and model in msg, msg
        assert "still holds the file that was there before" in msg, msg
        assert sha256_of(final(dest)) == model and len(quarantined(dest)) == 1, run
    hub.clear_faults()  # the hub is mended: the model is hashed once, recorded, and kept
    r = dl.run(params(hub, dest))
    assert not r["changed"] and r["verified"] == "hashed" and recorded_sha256(final(dest)) == model


def test_a_forged_record_the_hub_contradicts_is_hashed_and_the_model_fetched_again(hub, dest, model):
    """Other bytes of the same size and a record rewritten to describe them (their own sha256, the same
    commit), written by the run's own user so that the record is trusted: the hub states the original
    sha256 for that commit, so the record is hashed again, the bytes do not match the hub, and the hub's
    verified file replaces them (the forged bytes go to the quarantine slot)."""
    r = dl.run(params(hub, dest))
    forged = _forge(r["path"], None, uid=None)
    r2 = dl.run(params(hub, dest))
    assert r2["changed"] and r2["verified"] == "download" and r2["sha256"] == model, r2["msg"]
    assert "misreports" not in r2["msg"] and "Kept the verified file" not in r2["msg"]
    assert sha256_of(final(dest)) == model and recorded_sha256(final(dest)) == model
    q = quarantined(dest)
    assert len(q) == 1 and sha256_of(q[0]) == forged and q[0] in r2["msg"]


def test_a_wrong_claim_keeps_the_file_in_place_until_verified_bytes_are_ready(hub, dest, model):
    """The hub states a sha256 that neither the file by hand nor the bytes it serves have: the file stays
    at the final path, the downloaded bytes go to the one quarantine slot, and the message says so."""
    mine = place(hub, dest, b"hand-made model" * 1000)
    hub.set_fault("claim", sha256=OTHER_SHA)
    for run in range(3):
        with pytest.raises(dl.DownloadError) as e:
            dl.run(params(hub, dest))
        msg = e.value.msg
        assert "checksum mismatch" in msg and "left untouched" not in msg
        assert "still holds the file that was there before" in msg, msg
        assert sha256_of(final(dest)) == mine  # never moved off its path
        q = quarantined(dest)
        assert len(q) == 1 and q[0] in msg and sha256_of(q[0]) == model, (run, q)
        if run:
            assert "replacing the older copy" in msg


def test_a_matching_sha256_wins_over_the_size_claim(hub, dest, model):
    place(hub, dest)
    hub.set_fault("claim", size=SIZE + 1)
    r = dl.run(params(hub, dest))
    assert r["verified"] == "hashed" and not r["changed"] and r["size"] == SIZE
    assert "states %d bytes" % (SIZE + 1) in r["msg"] and "sha256 wins" in r["msg"], r["msg"]
    assert sha256_of(final(dest)) == model and quarantined(dest) == []
    again = dl.run(params(hub, dest))  # recorded: the sidecar's sha256 still wins
    assert again["verified"] == "sidecar" and again["size"] == SIZE


def test_a_wrong_size_claim_fails_once_and_says_retrying_will_not_help(hub, dest, model):
    hub.set_fault("claim", size=SIZE + 1)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, retries=3))
    msg = e.value.msg
    assert "rerun to resume" not in msg and "Content-Range" not in msg, msg
    assert str(SIZE) in msg and str(SIZE + 1) in msg and "nothing reached the final path" in msg
    assert not os.path.exists(final(dest))
    gets = [x for x in hub.requests() if x["method"] == "GET" and x["path"].startswith("/cdn/")]
    assert len(gets) == 1, "a metadata conflict is not a transient error: %r" % gets


def test_quarantine_keeps_one_copy_per_file(hub, dest, model):
    hub.set_fault("corrupt", offset=12345)
    for _ in range(3):
        with pytest.raises(dl.DownloadError):
            dl.run(params(hub, dest))
    q = quarantined(dest)
    assert len(q) == 1 and os.path.basename(q[0]).startswith("model.gguf.corrupt-")
    assert not os.path.exists(final(dest))


def test_a_replaced_file_goes_to_the_quarantine_slot_and_the_message_says_so(hub, dest, model):
    place(hub, dest, b"x" * SIZE)  # same size, other bytes
    r = dl.run(params(hub, dest))
    q = quarantined(dest)
    assert r["changed"] and sha256_of(final(dest)) == model
    assert len(q) == 1 and q[0] in r["msg"] and open(q[0], "rb").read() == b"x" * SIZE


# =============================================================================================
# Split sets at one commit
# =============================================================================================
def test_every_part_of_a_split_set_resolves_to_the_first_parts_commit(hub, dest):
    for i in (1, 2, 3):
        hub.add_file("org/m/S-0000%d-of-00003.gguf" % i, 1500 + i, seed=i)
    first = hub.commit("org/m")
    hub.set_fault("move_after", heads=1)  # main moves right after the first part's HEAD
    r = dl.run(params(hub, dest, filename="S-00001-of-00003.gguf"))
    assert hub.commit("org/m") != first, "the branch did not move"
    assert [p["commit"] for p in r["parts"]] == [first] * 3
    fetched = [x["path"] for x in hub.requests() if x["method"] == "GET"]
    assert fetched and all("/resolve/%s/" % first in p or "commit=%s" % first in p for p in fetched), fetched
    records = [json.load(open(dl.sidecar_path(p))) for p in r["paths"]]
    assert [rec["commit"] for rec in records] == [first] * 3


SPLIT = ["S-0000%d-of-00003.gguf" % i for i in (1, 2, 3)]


def _half_set(hub, dest):
    """A split set of which run 1 verified part 1 at commit C and failed on part 2 (the hub's sha256 for it
    was wrong); then the branch moves to D.  Returns (C, D)."""
    for i, name in enumerate(SPLIT, 1):
        hub.add_file("org/m/" + name, 1500 + i, seed=i)
    first = hub.commit("org/m")
    hub.set_fault("claim", sha256=OTHER_SHA, file=SPLIT[1])
    with pytest.raises(dl.DownloadError, match="checksum mismatch"):
        dl.run(params(hub, dest, filename=SPLIT[0]))
    hub.clear_faults()
    assert recorded_sha256(final(dest, SPLIT[0])) and not os.path.exists(final(dest, SPLIT[1]))
    return first, hub.move_main("org/m")


def _commits(r):
    """The commit of every part: in the result and in the sidecar records."""
    return ([p["commit"] for p in r["parts"]],
            [json.load(open(dl.sidecar_path(final_path)))["commit"] for final_path in r["paths"]])


def test_the_rest_of_a_half_fetched_set_comes_from_the_kept_parts_commit(hub, dest):
    first, moved = _half_set(hub, dest)
    hub.reset_stats()
    r = dl.run(params(hub, dest, filename=SPLIT[0]))
    assert r["changed"] and r["commit"] == first and _commits(r) == ([first] * 3, [first] * 3), r["msg"]
    assert r["update_available"] and moved in r["msg"] and "update: true" in r["msg"], r["msg"]
    fetched = [x["path"] for x in hub.requests() if x["method"] == "GET"]
    assert len(fetched) >= 2 and all("/resolve/%s/" % first in p or "commit=%s" % first in p
                                     for p in fetched), fetched
    again = dl.run(params(hub, dest, filename=SPLIT[0]))  # the set is whole: nothing to do, still at C
    assert not again["changed"] and _commits(again) == ([first] * 3, [first] * 3)


def test_a_half_fetched_set_with_update_moves_whole_to_the_new_commit(hub, dest):
    first, moved = _half_set(hub, dest)
    r = dl.run(params(hub, dest, filename=SPLIT[0], update=True))
    assert r["commit"] == moved and _commits(r) == ([moved] * 3, [moved] * 3), r["msg"]


def test_a_set_whose_parts_are_on_disk_from_two_commits_is_made_one(hub, dest):
    """Parts recorded at two commits (what an earlier release left): the set comes back to one commit."""
    first, moved = _half_set(hub, dest)
    dl.run(params(hub, dest, filename=SPLIT[0], update=True))  # the whole set at D
    side = dl.sidecar_path(final(dest, SPLIT[0]))  # part 1 as if kept from C
    rec = json.load(open(side))
    rec["commit"] = first
    with open(side, "w") as f:
        json.dump(rec, f)
    r = dl.run(params(hub, dest, filename=SPLIT[0]))
    assert r["commit"] == first and _commits(r) == ([first] * 3, [first] * 3), r["msg"]


def test_a_set_on_disk_from_two_commits_is_never_reported_as_one(hub, dest):
    """The hub cannot be reached and the parts are recorded at two commits: the run fails, naming each
    part's commit, and changes nothing (it used to keep the set and report the first part's commit)."""
    for i, name in enumerate(SPLIT, 1):
        hub.add_file("org/m/" + name, 1500 + i, seed=i)
    r = dl.run(params(hub, dest, filename=SPLIT[0]))
    side = dl.sidecar_path(final(dest, SPLIT[1]))
    rec = json.load(open(side))
    rec["commit"] = "a" * 40
    with open(side, "w") as f:
        json.dump(rec, f)
    before = dict((p, sha256_of(p)) for p in r["paths"])
    hub.stop()
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, filename=SPLIT[0], retries=0))
    msg = e.value.msg
    assert "2 commits" in msg and "%s: %s" % (SPLIT[1], "a" * 40) in msg and r["commit"] in msg, msg
    assert dict((p, sha256_of(p)) for p in r["paths"]) == before and json.load(open(side)) == rec


def test_a_set_that_cannot_move_verifiably_stays_whole_at_its_commit(hub, dest):
    """update: true, but the new commit's claim for part 1 vouches for nothing (0 bytes, no sha256): part 1
    is kept, so the other parts stay at its commit too (never a set of two commits)."""
    for i, name in enumerate(SPLIT, 1):
        hub.add_file("org/m/" + name, 1500 + i, seed=i)
    r = dl.run(params(hub, dest, filename=SPLIT[0]))
    first = r["commit"]
    moved = hub.move_main("org/m")
    hub.set_fault("claim", size=0, sha256="", file=SPLIT[0])
    r = dl.run(params(hub, dest, filename=SPLIT[0], update=True))
    assert not r["changed"] and _commits(r) == ([first] * 3, [first] * 3), r["msg"]
    assert r["update_available"] and moved in r["msg"] and "0 bytes and no sha256" in r["msg"], r["msg"]
    assert any("every part stays at commit %s" % first in w for w in r["warnings"]), r["warnings"]
    assert [sha256_of(p) for p in r["paths"]] == [p["sha256"] for p in r["parts"]]


# =============================================================================================
# What the fast path trusts: a record the service user cannot write
# =============================================================================================
def _forge(path, sha, uid=SERVICE_UID):
    """As ``uid`` (the service user; None: the run's own user): a model of the right size with other bytes,
    and a record that describes it (size, mtime, inode, ctime) with ``sha`` copied in (None: the forged
    bytes' own sha256).  Returns the forged bytes' sha256."""
    side = dl.sidecar_path(path)
    rec = json.load(open(side))
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(b"\xee" * rec["size"])
    own = sha256_of(path)
    if uid is not None:
        os.chown(path, uid, uid)
    st = os.stat(path)
    rec.update(size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, inode=st.st_ino,
               sha256=own if sha is None else sha)
    os.unlink(side)
    with open(side, "w") as f:
        json.dump(rec, f)
    os.chmod(side, 0o644)
    if uid is not None:
        os.chown(side, uid, uid)
    assert dl.sidecar_matches_file(rec, path)
    return own


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as the service user (chown)")
def test_a_record_forged_by_the_service_user_is_not_trusted(hub, dest, model):
    r = dl.run(params(hub, dest))
    _forge(r["path"], model)
    r2 = dl.run(params(hub, dest))
    assert r2["verified"] != "sidecar" and sha256_of(final(dest)) == model
    assert recorded_sha256(final(dest)) == model  # rewritten by the run's own user
    assert os.stat(dl.sidecar_path(final(dest))).st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as the service user (chown)")
def test_gguf_info_does_not_trust_a_forged_record_either(hub, dest, model):
    r = dl.run(params(hub, dest))
    _forge(r["path"], model)
    assert recorded_sha256(final(dest)) is None


def test_a_record_others_can_write_is_not_trusted(hub, dest, model):
    r = dl.run(params(hub, dest))
    os.chmod(dl.sidecar_path(r["path"]), 0o666)
    assert recorded_sha256(r["path"]) is None
    assert dl.run(params(hub, dest))["verified"] == "hashed"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to the service user (chown)")
def test_the_record_belongs_to_the_runs_user_not_to_the_files_owner(hub, dest, model):
    def give_to_the_service_user(path):  # what the module's owner/group arguments do
        os.chown(path, SERVICE_UID, SERVICE_UID)
        return True
    r = dl.run(params(hub, dest), set_attributes=give_to_the_service_user)
    st = os.stat(dl.sidecar_path(r["path"]))
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert dl.run(params(hub, dest))["verified"] == "sidecar"


def test_a_record_nested_100k_deep_is_no_record(hub, dest, model):
    r = dl.run(params(hub, dest))
    with open(dl.sidecar_path(r["path"]), "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    assert recorded_sha256(r["path"]) is None
    assert dl.run(params(hub, dest))["verified"] == "hashed"


# =============================================================================================
# Messages that are true
# =============================================================================================
@pytest.mark.parametrize("filename", ["sub/", ".", "sub/.", "/", "a//b.gguf", "x\ny.gguf", "x\udcff.gguf"])
def test_a_filename_that_names_no_file_is_refused_as_such(hub, dest, model, filename):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, filename=filename))
    msg = e.value.msg
    assert "filename" in msg and "Remove it" not in msg and "is a directory" not in msg, msg
    assert os.listdir(str(dest)) == [] and hub.requests() == []


@pytest.mark.parametrize("url_path", ["/cdn/org/m/", "/cdn/org/m/.", "/cdn/org/m/.."])
def test_a_url_that_names_no_file_is_refused_as_such(hub, dest, url_path):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(dict(url=hub.url + url_path, dest=str(dest)))
    assert "file name" in e.value.msg and "Remove it" not in e.value.msg, e.value.msg


@pytest.mark.parametrize("size", [-1, 2 ** 63, 10 ** 30])
def test_an_impossible_size_option_is_refused_before_anything_is_written(hub, dest, model, size):
    with pytest.raises(dl.DownloadError) as e:  # a plain url: no hub size to disagree with
        dl.run(dict(url=hub.url + "/cdn/org/m/model.gguf", dest=str(dest), size=size, free_space_margin=0))
    assert "size" in e.value.msg and "Errno" not in e.value.msg, e.value.msg
    assert os.listdir(str(dest)) == []


def test_an_impossible_size_from_the_hub_is_refused_and_leaves_no_part(hub, dest, model):
    hub.set_fault("claim", size=2 ** 63)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "impossible size" in e.value.msg and "Errno" not in e.value.msg, e.value.msg
    assert listing(dest) == []


def test_a_size_the_filesystem_cannot_hold_leaves_no_empty_part(hub, dest, model, monkeypatch):
    import errno

    def refuse(fd, offset, length):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    monkeypatch.setattr(dl.os, "posix_fallocate", refuse)
    monkeypatch.setattr(dl.os, "ftruncate", lambda fd, n: refuse(fd, 0, n) if n else None)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "model.gguf.part" in e.value.msg and "too large" in e.value.msg.lower(), e.value.msg
    assert listing(dest) == []


@pytest.mark.parametrize("option,url", [("endpoint", "{'a': [1]}"), ("endpoint", "http://[::1"),
                                        ("endpoint", "ftp://mirror"), ("url", "file:///etc/shadow"),
                                        ("url", "http:///model.gguf"), ("url", "http://h:99999999/m.gguf")])
def test_a_url_that_is_not_http_with_a_host_is_refused_naming_the_option(hub, dest, option, url):
    p = params(hub, dest, endpoint=url) if option == "endpoint" else dict(url=url, dest=str(dest))
    with pytest.raises(dl.DownloadError) as e:
        dl.run(p)
    assert e.value.msg.startswith(option + " must be an http(s) URL"), e.value.msg


@pytest.mark.parametrize("option,value", [("retry_delay", float("nan")), ("retry_delay", float("inf")),
                                          ("retry_delay", -1.0), ("timeout", 10 ** 30), ("retries", 10 ** 9),
                                          ("lock_timeout", 10 ** 30), ("free_space_margin", -1),
                                          ("parallel_min_size", -5), ("connections", 0)])
def test_numbers_out_of_range_are_refused_naming_the_option(hub, dest, option, value):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, **{option: value}))
    assert option in e.value.msg, e.value.msg


# =============================================================================================
# A signed URL's query string: never in the module's output
# =============================================================================================
SIGNATURE = "fa1afe1c0ffee5ca1ab1e5eed5a1ad5a1ad5a1ad"
QUERY = "X-Amz-Credential=AKIDEXAMPLE%2F20240101&X-Amz-Signature=" + SIGNATURE


def test_a_signed_urls_query_is_masked_in_the_module_result(hub, dest, model, tmp_path):
    res = run_module_file(tmp_path, "model_download",
                          dict(url=hub.url + "/cdn/org/m/model.gguf?" + QUERY, dest=str(dest)))
    text = json.dumps(res)
    assert not res.get("failed"), res
    assert SIGNATURE not in text and "AKIDEXAMPLE" not in text, text
    assert res["invocation"]["module_args"]["url"].endswith("/cdn/org/m/model.gguf?********")
    assert res["warnings"] and "url_query" in " ".join(res["warnings"])


def test_url_query_carries_the_signature_outside_the_logged_arguments(hub, dest, model, tmp_path):
    res = run_module_file(tmp_path, "model_download",
                          dict(url=hub.url + "/cdn/org/m/model.gguf", url_query=QUERY, dest=str(dest)))
    assert not res.get("failed"), res
    assert SIGNATURE not in json.dumps(res) and not res.get("warnings")
    assert sha256_of(res["path"]) == model
    sent = [x["path"] for x in hub.requests() if x["method"] == "GET"]
    assert sent and all(p.endswith("?" + QUERY) for p in sent), sent
    assert download_options.OPTIONS["url_query"].get("no_log") is True
    assert json.load(open(dl.sidecar_path(res["path"])))["source"]["url"].endswith("/cdn/org/m/model.gguf")
    assert stat.S_ISREG(os.lstat(res["path"]).st_mode)


def test_the_role_passes_url_query_var_and_never_prints_the_signature(tmp_path, hub, model):
    import sys

    import yaml

    from tests.helpers import run_local_playbook
    dest = str(tmp_path / "models" / "s3")
    item = {"name": "s3", "url": hub.url + "/cdn/org/m/model.gguf", "url_query_var": "vault_sig",
            "sha256": model}
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "vault_sig": QUERY},
        "tasks": [
            {"name": "Check the model list", "ansible.builtin.include_role": {
                "name": "llmops.serving.model", "tasks_from": "validate.yml"},
             "vars": {"model_models": [item]}},
            {"name": "One model through the role's task file", "ansible.builtin.include_role": {
                "name": "llmops.serving.model", "tasks_from": "model.yml"},
             "vars": {"_model_item": item, "_model_dest": dest, "_model_progress_file": dest + "/.p.json",
                      "model_check_structure": False, "model_progress_interval": 1,
                      "model_download_timeout": 120, "model_retries": 1}},
        ]}]))
    result, stats = run_local_playbook(play, os.path.dirname(sys.executable), extra_args=("-vvv",))
    out = result.stdout + result.stderr
    assert stats.get("failed") == 0, out
    assert sha256_of(os.path.join(dest, "model.gguf")) == model
    assert SIGNATURE not in out and "AKIDEXAMPLE" not in out
    sent = [x["path"] for x in hub.requests() if x["method"] == "GET"]
    assert sent and all(p.endswith("?" + QUERY) for p in sent), sent
