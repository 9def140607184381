# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The source plan (plugins/module_utils/_software/source_plan.py): one list from the roles' entries, what
the node has
is not probed, real probes against loopback servers (reachable, closed, silent past the deadline: bounded
time), the node's proxy for outside hosts and never for loopback, and a refusal that names source and key."""
import os
import subprocess
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._software import source_plan as sp

from tests.fixtures.recording_proxy import RecordingProxy
from tests.fixtures.source_servers import Silent, SourceServer, closed_port


def entry(name, kind, url, key="", why="role x (stage)", **extra):
    return dict(extra, name=name, kind=kind, url=url, key=key, why=why)


def test_the_plan_lists_each_source_with_its_probe_key_and_bundle_entry():
    plan = sp.plan([
        entry("docker-ce", "yum", "https://download.docker.com/linux/centos/7/$basearch/stable", "docker_ce"),
        entry("nvidia-cuda", "apt", "https://cuda.lan/repos/debian12/x86_64", "nvidia_cuda"),
        entry("builder", "image", "registry.lan:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04@sha256:" + "a" * 64,
              "registry"),
        entry("vllm", "image", "vllm/vllm-openai:v0.33.0", "registry"),
        entry("llama.cpp", "git", "https://github.com/ggml-org/llama.cpp.git", "llama_cpp_git"),
        entry("qwen", "hf", "https://hf-mirror.com", "hf", repo="unsloth/Qwen3-GGUF"),
        entry("qwen-ms", "modelscope", "https://www.modelscope.cn", "modelscope", repo="org/name"),
        entry("vllm-wheels", "pypi", "https://pypi.lan/simple/", "pypi", package="vllm"),
        entry("node_exporter", "binary", "https://github.com/x/node_exporter-1.5.0.linux-amd64.tar.gz",
              "prometheus_releases", bundle="node_exporter-1.5.0.linux-amd64.tar.gz"),
    ])
    got = dict((s["name"], (s["probe"], s["key"], s["bundle"])) for s in plan)
    assert got == {
        "docker-ce": ("https://download.docker.com/linux/centos/7/x86_64/stable/repodata/repomd.xml",
                      "docker_ce", "packages/docker-ce"),
        "nvidia-cuda": ("https://cuda.lan/repos/debian12/x86_64/Release", "nvidia_cuda",
                        "packages/nvidia-cuda"),
        "builder": ("https://registry.lan:5000/v2/", "registry",
                    "images/nvidia_cuda_12.4.1-devel-ubuntu22.04"),
        "vllm": ("https://registry-1.docker.io/v2/", "registry", "images/vllm_vllm-openai_v0.33.0"),
        "llama.cpp": ("https://github.com/ggml-org/llama.cpp.git/info/refs?service=git-upload-pack",
                      "llama_cpp_git", "git/llama.cpp"),
        "qwen": ("https://hf-mirror.com/api/models/unsloth/Qwen3-GGUF", "hf", "models/qwen"),
        "qwen-ms": ("https://www.modelscope.cn/api/v1/models/org/name", "modelscope", "models/qwen-ms"),
        "vllm-wheels": ("https://pypi.lan/simple/vllm/", "pypi", "packages/vllm-wheels"),
        "node_exporter": ("https://github.com/x/node_exporter-1.5.0.linux-amd64.tar.gz",
                          "prometheus_releases", "binaries/node_exporter-1.5.0.linux-amd64.tar.gz"),
    }


def test_an_apt_suite_repository_is_probed_at_its_release_file():
    (source,) = sp.plan([entry("ubuntu", "apt", "https://ubuntu.lan/ubuntu/", "ubuntu_apt", suite="jammy")])
    assert source["probe"] == "https://ubuntu.lan/ubuntu/dists/jammy/Release"


def test_a_loopback_registry_is_probed_over_http():
    (source,) = sp.plan([entry("img", "image", "127.0.0.1:5000/nvidia/cuda:12.4.1-base", "registry")])
    assert source["probe"] == "http://127.0.0.1:5000/v2/"


def test_sources_two_roles_need_are_one_source_with_both_reasons():
    plan = sp.plan([entry("hub", "hf", "https://hf.lan", "hf", why="model a", repo="o/r"),
                    entry("hub", "hf", "https://hf.lan", "hf", why="model b", repo="o/r"),
                    entry("other", "hf", "https://hf.lan", "hf", why="model c", repo="o/s")])
    assert [(s["name"], s["why"]) for s in plan] == [("hub", ["model a", "model b"]), ("other", ["model c"])]


@pytest.mark.parametrize("bad, says", [
    (dict(name="x", kind="ftp", url="ftp://x", why="w"), "unknown kind 'ftp'"),
    (dict(name="x", kind="yum", url="", why="w"), "has no url"),
    (dict(name="x", kind="yum", url="https://x"), "has no why"),
    ("docker-ce", "must be a mapping"),
])
def test_a_malformed_entry_is_refused_naming_it(bad, says):
    with pytest.raises(sp.SourcePlanError, match=says):
        sp.plan([bad])


# --- what the node has ---------------------------------------------------------------------------------


class Runner(object):
    """Answers commands from a table {argv tuple: (rc, out)}; records them."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    def __call__(self, argv):
        self.calls.append(tuple(argv))
        rc, out = self.table.get(tuple(argv), (1, ""))
        return rc, out, ""


def test_a_repository_whose_packages_are_all_installed_is_not_needed():
    source = sp.plan([entry("docker-ce", "yum", "https://x/stable", "docker_ce",
                            have={"packages": ["docker-ce-26.1.4", "containerd.io-1.6.33"]})])[0]
    both = Runner({("rpm", "-q", "docker-ce-26.1.4"): (0, ""),
                   ("rpm", "-q", "containerd.io-1.6.33"): (0, "")})
    assert sp.have(source, both, "rpm")
    one = Runner({("rpm", "-q", "docker-ce-26.1.4"): (0, "")})
    assert not sp.have(source, one, "rpm")


@pytest.mark.parametrize("out, want", [
    ("installed 1.17.8-1", True),
    ("installed 1.17.7-1", False),          # another version: the repository is needed for the pinned one
    ("config-files 1.17.8-1", False),       # removed, configuration left
])
def test_dpkg_specs_match_the_installed_version(out, want):
    runner = Runner({("dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", "nvidia-container-toolkit"):
                     (0, out)})
    assert sp.packages_installed(["nvidia-container-toolkit=1.17.8-*"], "dpkg", runner) is want


def test_a_source_two_roles_need_is_probed_unless_both_find_it_on_the_node():
    source = sp.plan([entry("img", "image", "nvidia/cuda:12.4.1-base", "registry", why="a",
                            have={"image": "nvidia/cuda:12.4.1-base"}),
                      entry("img", "image", "nvidia/cuda:12.4.1-base", "registry", why="b")])[0]
    inspect = ("docker", "image", "inspect", "--format", "{{.Id}}", "nvidia/cuda:12.4.1-base")
    runner = Runner({inspect: (0, "x")})
    assert not sp.have(source, runner)


def test_an_image_present_by_digest_is_not_needed():
    ref = "nvidia/cuda@sha256:" + "b" * 64
    source = sp.plan([entry("img", "image", ref, "registry", have={"image": ref})])[0]
    assert sp.have(source, Runner({("docker", "image", "inspect", "--format", "{{.Id}}", ref): (0, "sha")}))
    assert not sp.have(source, Runner({}))


def test_no_docker_on_the_node_means_the_image_is_needed():
    def missing(argv):
        raise OSError("docker: not found")
    source = sp.plan([entry("img", "image", "x/y:1", "registry", have={"image": "x/y:1"})])[0]
    assert not sp.have(source, missing)


def git(*args, cwd):
    subprocess.run(["git"] + list(args), cwd=cwd, check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


def test_a_llama_cpp_tree_at_the_pin_is_not_needed_and_one_elsewhere_is(tmp_path):
    tree = tmp_path / "src" / "abc"
    tree.mkdir(parents=True)
    git("init", "-q", cwd=tree)
    (tree / "f").write_text("1")
    git("add", "f", cwd=tree)
    git("commit", "-qm", "one", cwd=tree)
    pin = subprocess.check_output(["git", "-C", str(tree), "rev-parse", "HEAD"], text=True).strip()

    def runner(argv):
        done = subprocess.run(argv, capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr
    at_pin = sp.plan([entry("llama.cpp", "git", "https://x/llama.cpp.git", "llama_cpp_git",
                            have={"git_tree": {"root": str(tmp_path / "src"), "commit": pin}})])[0]
    assert sp.have(at_pin, runner)
    other = sp.plan([entry("llama.cpp", "git", "https://x/llama.cpp.git", "llama_cpp_git",
                           have={"git_tree": {"root": str(tmp_path / "src"), "commit": "0" * 40}})])[0]
    assert not sp.have(other, runner)


def test_a_verified_model_is_not_needed_and_an_unverified_file_is(tmp_path):
    from ansible_collections.llmops.serving.plugins.module_utils._download.sidecar import write_sidecar_record
    from ansible_collections.llmops.serving.plugins.module_utils._files.safe import hash_file
    final = tmp_path / "m.gguf"
    final.write_bytes(b"GGUF" + b"\0" * 64)
    source = sp.plan([entry("m", "hf", "https://hf.lan", "hf", repo="o/r", have={"model": str(final)})])[0]
    assert not sp.have(source, Runner({}))       # the bytes are there, but nothing vouches for them
    write_sidecar_record(str(final), hash_file(str(final)))
    assert sp.have(source, Runner({}))
    final.write_bytes(b"GGUF" + b"\1" * 64)      # replaced since: needed again
    assert not sp.have(source, Runner({}))


def test_a_source_without_a_have_check_is_always_probed():
    assert not sp.have(sp.plan([entry("x", "yum", "https://x", "k")])[0], Runner({}))


# --- the offline bundle --------------------------------------------------------------------------------


BUNDLE = {"entries": ["git/llama.cpp", "images/llama.cpp", "models/qwen", "packages/debian12"],
          "images": [{"name": "images/llama.cpp", "refs": ["llmops/llama.cpp:0123456789abcdef"]},
                     {"name": "images/cuda-runtime", "refs": ["nvidia/cuda:12.4.1-runtime-ubuntu22.04"]}],
          "packages": [{"name": "packages/debian12", "format": "deb"},
                       {"name": "packages/centos7", "format": "rpm"}]}


@pytest.mark.parametrize("ref, want", [
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "nvidia/cuda:12.4.1-runtime-ubuntu22.04"),
    ("registry.lan:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:" + "a" * 64,
     "nvidia/cuda:12.4.1-runtime-ubuntu22.04"),
    ("127.0.0.1:18301/vllm/vllm-openai", "vllm/vllm-openai:latest"),
    ("localhost/x:1", "x:1"),
    ("docker.io/library/ubuntu:22.04", "library/ubuntu:22.04"),
])
def test_an_image_is_named_by_repository_and_tag_whatever_registry_serves_it(ref, want):
    assert sp.repository_and_tag(ref) == want


def test_the_bundle_stages_package_repositories_images_by_name_and_its_own_entries():
    def staged(kind, url, **extra):
        return sp.in_bundle(sp.plan([dict(entry("s", kind, url, "k"), **extra)])[0], BUNDLE)
    assert staged("apt", "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64") \
        == "packages/debian12"
    assert staged("yum", "https://download.docker.com/linux/centos/7/$basearch/stable") == "packages/centos7"
    assert staged("image", "registry.lan/nvidia/cuda:12.4.1-runtime-ubuntu22.04") == "images/cuda-runtime"
    assert staged("git", "https://github.com/ggml-org/llama.cpp.git", bundle="llama.cpp") == "git/llama.cpp"
    assert staged("hf", "https://hf-mirror.com", repo="org/qwen", bundle="qwen") == "models/qwen"
    # and the other direction: what the bundle does not hold is probed
    assert staged("image", "nvidia/cuda:12.4.1-devel-ubuntu22.04") is None
    # pinned by digest: a loaded image has no registry digest, the pull would still go out
    assert staged("image", "nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:" + "b" * 64) is None
    # the builder image's apt runs inside the image: the node's bundle repositories are not its sources
    assert staged("apt", "http://archive.ubuntu.com/ubuntu", suite="jammy",
                  have={"image": "builder:1"}) is None
    assert staged("hf", "https://hf-mirror.com", repo="org/other", bundle="other") is None
    assert staged("pypi", "https://pypi.org/simple", package="vllm") is None
    assert staged("binary", "https://github.com/prometheus/x.tar.gz", bundle="x.tar.gz") is None
    assert sp.in_bundle(sp.plan([entry("s", "apt", "https://x/apt", "k")])[0], {}) is None
    for packages in ([], [{"name": "packages/centos7", "format": "rpm"}]):
        other = dict(BUNDLE, packages=packages)
        assert sp.in_bundle(sp.plan([entry("s", "apt", "https://x/apt", "k")])[0], other) is None


# --- probes --------------------------------------------------------------------------------------------


def test_probes_reachable_closed_and_silent_sources_within_the_deadline():
    with SourceServer() as server, Silent() as silent:
        plan = sp.plan([
            entry("repo", "yum", server.url + "/repo", "centos_vault"),
            entry("registry", "image", "127.0.0.1:%d/nvidia/cuda:1" % server.port, "registry"),
            entry("git", "git", server.url + "/llama.cpp.git", "llama_cpp_git"),
            entry("missing", "yum", server.url + "/nothing", "epel_archive"),
            entry("closed", "yum", "http://127.0.0.1:%d/repo" % closed_port(), "docker_ce"),
            entry("silent", "apt", silent.url + "/apt", "nvidia_cuda"),
        ])
        start = time.monotonic()
        errors = sp.probe_all(plan, {}, 2)
        took = time.monotonic() - start
    assert errors["repo"] is None and errors["registry"] is None and errors["git"] is None
    assert "answered HTTP 404" in errors["missing"]
    assert "TCP connect to 127.0.0.1:" in errors["closed"] and "refused" in errors["closed"].lower()
    assert "timed out" in errors["silent"] or "no answer" in errors["silent"], errors["silent"]
    assert took < 4, "the probes took %.1fs past a 2s deadline" % took
    assert "/repo/repodata/repomd.xml" in server.seen
    assert "/llama.cpp.git/info/refs?service=git-upload-pack" in server.seen


def test_many_silent_sources_still_end_at_one_deadline():
    with Silent() as silent:
        plan = sp.plan([entry("s%d" % i, "yum", "%s/r%d" % (silent.url, i), "k") for i in range(12)])
        start = time.monotonic()
        errors = sp.probe_all(plan, {}, 1.5)
        took = time.monotonic() - start
    assert all(errors.values())
    assert took < 3, "12 silent sources took %.1fs: the probes are not concurrent" % took


def test_a_file_url_is_checked_on_the_node(tmp_path):
    (tmp_path / "repodata").mkdir()
    (tmp_path / "repodata" / "repomd.xml").write_text("<repomd/>")
    plan = sp.plan([entry("here", "yum", "file://%s" % tmp_path, "k"),
                    entry("gone", "yum", "file://%s/none" % tmp_path, "k")])
    errors = sp.probe_all(plan, {}, 2)
    assert errors["here"] is None
    assert errors["gone"] == "%s/none/repodata/repomd.xml does not exist on the node" % tmp_path


def test_outside_hosts_go_through_the_proxy_and_loopback_never_does():
    with RecordingProxy() as proxy, SourceServer() as server:
        proxies = sp.proxy_settings({}, "http_proxy=%s\nhttps_proxy=%s\n" % (proxy.url, proxy.url))
        plan = sp.plan([entry("outside", "yum", "http://mirror.example.invalid/centos", "centos_vault"),
                        entry("local", "yum", server.url + "/repo", "centos_vault")])
        errors = sp.probe_all(plan, proxies, 3)
        # '' is the probe's bare TCP connect to the first hop (here the proxy), before its request
        seen = [line for line in proxy.seen if line]
    assert errors["local"] is None
    assert seen == ["GET http://mirror.example.invalid/centos/repodata/repomd.xml HTTP/1.1"]
    assert "through proxy" in errors["outside"] and "HTTP 502" in errors["outside"]


def test_no_proxy_hosts_go_direct():
    proxies = sp.proxy_settings({"https_proxy": "http://proxy.lan:3128", "no_proxy": ".lan,example.com"})
    assert sp.route("https://mirror.lan/x", proxies) == (None, "mirror.lan", 443)
    assert sp.route("https://example.com/x", proxies) == (None, "example.com", 443)
    assert sp.route("https://hf-mirror.com/x", proxies) == ("http://proxy.lan:3128", "hf-mirror.com", 443)


def test_the_environment_file_is_read_and_the_process_environment_wins():
    text = 'export HTTPS_PROXY="http://etc.lan:3128"\n# comment\nhttp_proxy=http://etc.lan:3128\nPATH=/bin\n'
    assert sp.proxy_settings({}, text) == {"http": "http://etc.lan:3128", "https": "http://etc.lan:3128"}
    assert sp.proxy_settings({"https_proxy": "http://env.lan:1"}, text)["https"] == "http://env.lan:1"


RELEASE = "/prometheus/prometheus/releases/download/v2.54.1/prometheus-2.54.1.linux-amd64.tar.gz"
OBJECT = "/objects/prometheus-2.54.1.linux-amd64.tar.gz"


@pytest.mark.timeout(30)
def test_a_release_download_redirected_elsewhere_is_reached_where_it_is_sent():
    """github.com answers a release download with 302 to objects.githubusercontent.com (a signed query): the
    probe follows it and the source is reached when the place it is sent to answers."""
    with SourceServer() as objects, SourceServer() as releases:
        releases.redirects[RELEASE] = objects.url + OBJECT + "?X-Amz-Signature=secret&response-content-type=x"
        (source,) = sp.plan([entry("prometheus", "binary", releases.url + RELEASE, "github_releases")])
        assert source["probe"] == releases.url + RELEASE
        assert sp.probe_all([source], {}, 5) == {"prometheus": None}
    assert releases.seen == [RELEASE]
    assert objects.seen == [OBJECT + "?X-Amz-Signature=secret&response-content-type=x"]


@pytest.mark.timeout(30)
def test_a_redirect_to_a_place_out_of_reach_is_unreachable_naming_the_hop():
    port = closed_port()
    with SourceServer() as objects, SourceServer() as releases:
        releases.redirects[RELEASE] = "http://127.0.0.1:%d%s?X-Amz-Signature=secret" % (port, OBJECT)
        releases.redirects["/gone"] = objects.url + "/objects/gone.tar.gz"
        releases.redirects["/loop"] = "/loop"
        plan = sp.plan([entry("closed", "binary", releases.url + RELEASE, "github_releases"),
                        entry("missing", "binary", releases.url + "/gone", "github_releases"),
                        entry("loop", "binary", releases.url + "/loop", "github_releases")])
        start = time.monotonic()
        errors = sp.probe_all(plan, {}, 5)
        took = time.monotonic() - start
    closed = "%s%s (redirected to http://127.0.0.1:%d%s): TCP connect to 127.0.0.1:%d failed" % (
        releases.url, RELEASE, port, OBJECT, port)
    assert errors["closed"].startswith(closed), errors["closed"]
    assert "secret" not in errors["closed"]                  # a signed query is never written into a log
    assert errors["missing"] == "%s/gone (redirected to %s/objects/gone.tar.gz) answered HTTP 404" % (
        releases.url, objects.url)
    assert errors["loop"] == "%s/loop: more than 5 redirects (the last to %s/loop)" % (
        releases.url, releases.url)
    assert took < 5


@pytest.mark.timeout(30)
def test_each_hop_of_a_redirect_takes_its_own_route():
    """A mirror in no_proxy (here loopback) that sends the client to an outside host: that hop goes through
    the node's proxy, as the download's would."""
    with RecordingProxy() as proxy, SourceServer() as releases:
        releases.redirects[RELEASE] = "http://objects.example.invalid" + OBJECT + "?sig=secret"
        proxies = sp.proxy_settings({"http_proxy": proxy.url})
        (source,) = sp.plan([entry("prometheus", "binary", releases.url + RELEASE, "github_releases")])
        error = sp.probe_all([source], proxies, 5)["prometheus"]
        seen = [line for line in proxy.seen if line]
    assert seen == ["GET http://objects.example.invalid%s?sig=secret HTTP/1.1" % OBJECT]
    assert error == ("%s%s (redirected to http://objects.example.invalid%s) answered HTTP 502"
                     " (through proxy %s)" % (releases.url, RELEASE, OBJECT, proxy.url))


# --- the refusal ---------------------------------------------------------------------------------------


def test_the_refusal_names_every_unreachable_source_its_error_and_its_key_or_bundle():
    plan = sp.plan([entry("docker-ce", "yum", "https://download.docker.com/x", "docker_ce",
                          why="nvidia_container_toolkit (GPU host stage)"),
                    entry("web-ui", "binary", "https://huggingface.co/", "", why="llama_cpp_web_ui (build)")])
    text = sp.refusal([(plan[0], "TCP connect to download.docker.com:443 failed: timed out"),
                       (plan[1], "no answer within 10s")], "node-01")
    assert text.startswith("2 source(s) this run needs cannot be reached from node-01; nothing was changed")
    assert ("- docker-ce (yum https://download.docker.com/x): TCP connect to download.docker.com:443 "
            "failed: timed out; needed by nvidia_container_toolkit (GPU host stage); set "
            "llmops_mirrors.docker_ce to a mirror the node reaches or stage packages/docker-ce of the "
            "offline bundle.") in text
    assert "- web-ui (binary https://huggingface.co/): no answer within 10s" in text
    assert "no llmops_mirrors key replaces it or stage binaries/web-ui" in text


def test_a_file_git_remote_is_its_directory_on_the_node(tmp_path):
    (source,) = sp.plan([entry("llama.cpp", "git", "file://%s/llama.cpp.git" % tmp_path, "llama_cpp_git")])
    assert source["probe"] == "file://%s/llama.cpp.git" % tmp_path
    assert sp.probe_all([source], {}, 2)["llama.cpp"].endswith("does not exist on the node")
    (tmp_path / "llama.cpp.git").mkdir()
    assert sp.probe_all([source], {}, 2)["llama.cpp"] is None


def test_a_hub_that_answers_is_reached_even_without_the_api_and_a_closed_one_is_not():
    with SourceServer() as server:
        plan = sp.plan([entry("hub", "hf", server.url, "hf", repo="o/r")])
        assert sp.probe_all(plan, {}, 2)["hub"] is None      # 404 at /api/models/o/r: the hub answered
    assert sp.probe_one(dict(plan[0], probe="http://127.0.0.1:%d/api" % closed_port()), {}, 2)


def test_the_docs_table_names_the_bundle_entries_of_the_sources_outside_the_probe():
    from tests.helpers import ROOT
    with open(os.path.join(ROOT, "docs", "mirrors.md"), encoding="utf-8") as handle:
        doc = handle.read()
    for key in sp.OTHER_BUNDLE_ENTRIES:
        rows = [line for line in doc.splitlines() if line.startswith("| ") and "`%s`" % key in line
                and "offline" not in line]
        assert any("`%s`" % sp.other_bundle_entry(key) in row for row in rows), key


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_git_daemon_remote_is_asked_for_its_refs_in_gits_own_protocol(tmp_path):
    """git:// (the L20 twin's llama.cpp mirror, a site's git daemon): a real git daemon answers for a served
    repository, says ERR for one it does not serve; a closed port and a silent one are errors in time."""
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "llama.cpp.git")], check=True, timeout=30)
    port = _free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--base-path=%s" % tmp_path,
                               "--listen=127.0.0.1", "--port=%d" % port, str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while sp.probe_one({"probe": "git://127.0.0.1:%d/llama.cpp.git" % port, "kind": "git"}, {}, 2) \
                and time.monotonic() < deadline:
            time.sleep(0.1)            # until the daemon listens
        with Silent() as silent:
            plan = sp.plan([
                entry("served", "git", "git://127.0.0.1:%d/llama.cpp.git" % port, "llama_cpp_git"),
                entry("unserved", "git", "git://127.0.0.1:%d/nothing.git" % port, "llama_cpp_git"),
                entry("closed", "git", "git://127.0.0.1:%d/llama.cpp.git" % closed_port(), "llama_cpp_git"),
                entry("silent", "git", silent.url.replace("http://", "git://") + "/x.git", "llama_cpp_git"),
            ])
            start = time.monotonic()
            errors = sp.probe_all(plan, {}, 2)
            took = time.monotonic() - start
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
    assert errors["served"] is None
    assert "the git server says" in errors["unserved"] or "gave no git answer" in errors["unserved"], errors
    assert "TCP connect to 127.0.0.1:" in errors["closed"]
    assert errors["silent"] and took < 4, (errors["silent"], took)


def test_loopback_is_one_rule_for_the_probe_and_the_download():
    """download_http.is_loopback decides for both clients that a request stays on the machine (no proxy)."""
    from ansible_collections.llmops.serving.plugins.module_utils._download import http as download_http
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert download_http.is_loopback(host), host
    for host in ("10.0.0.1", "127.example.com", "hf-mirror.com", "", None, "::2"):
        assert not download_http.is_loopback(host), host
    assert sp.route("http://127.0.0.2:18301/v2/", {"http": "http://proxy:3128"})[0] is None
    assert sp.route("http://10.0.0.1/v2/", {"http": "http://proxy:3128"})[0] == "http://proxy:3128"
