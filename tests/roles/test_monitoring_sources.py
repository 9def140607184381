# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring roles' `sources` entry points and playbooks/monitoring.yml's probe: the sources a monitoring
run fetches from (EL release archives, the DCGM exporter image, Grafana's repository), built from the
settings (real ansible-playbook on localhost), planned with their mirrors keys and bundle entries, and probed
before the playbook's first change. The roles of site.yml: tests/roles/test_source_plan_roles.py."""
import json
import os
import subprocess
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._software import source_plan as sp

from tests.fixtures.source_servers import SourceServer, closed_port
from tests.helpers import ROOT, load_yaml, run_local_playbook
from tests.roles.test_stage_tags import read_only

EL7 = {"os_family": "RedHat", "distribution": "CentOS", "distribution_major_version": "7",
       "distribution_version": "7.9.2009"}
DEBIAN12 = {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "12",
            "distribution_version": "12.7"}
PROMETHEUS = "prometheus-2.54.1.linux-amd64.tar.gz"
NODE_EXPORTER = "node_exporter-1.5.0.linux-amd64.tar.gz"
PLAYBOOK = os.path.join(ROOT, "playbooks", "monitoring.yml")


def sources(tmp_path, facts, **settings):
    """The raw entries both entry points append, on a host with these OS facts."""
    settings = dict({"ansible_facts": facts, "ansible_python_interpreter": sys.executable}, **settings)
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        + "".join("    - ansible.builtin.include_role:\n        name: llmops.serving.%s\n"
                  "        tasks_from: sources\n" % role for role in ("monitoring_server", "monitoring"))
        + "    - ansible.builtin.copy:\n        content: '{{ llmops_sources | default([]) | to_json }}'\n"
          "        dest: %s\n        mode: '0600'\n" % (tmp_path / "out.json"))
    result, _stats = run_local_playbook(tmp_path / "play.yml", tmp_path,
                                        extra_args=["-e", "@%s" % (tmp_path / "vars.json")])
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp_path / "out.json").read_text())


@pytest.mark.timeout(120)
def test_an_el_node_lists_the_release_archives_and_grafanas_repository(tmp_path):
    entries = sources(tmp_path, EL7)
    by_name = dict((e["name"], e) for e in entries)
    assert sorted(by_name) == ["grafana", "node_exporter 1.5.0", "prometheus 2.54.1"]   # no DCGM by default
    prometheus = by_name["prometheus 2.54.1"]
    assert (prometheus["kind"], prometheus["key"], prometheus["bundle"]) == (
        "binary", "github_releases", PROMETHEUS)
    assert prometheus["url"] == "https://github.com/prometheus/prometheus/releases/download/v2.54.1/%s" % (
        PROMETHEUS)
    assert prometheus["have"] == {"file": "/var/cache/llmops-monitoring/" + PROMETHEUS}
    assert by_name["node_exporter 1.5.0"]["url"].endswith("/v1.5.0/" + NODE_EXPORTER)
    grafana = by_name["grafana"]
    assert (grafana["kind"], grafana["url"], grafana["suite"], grafana["key"]) == (
        "apt", "https://apt.grafana.com", "stable", "grafana")
    assert "have" not in grafana        # every run refreshes apt's cache from it (update_cache)

    plan = dict((s["name"], s) for s in sp.plan(entries))
    assert plan["grafana"]["probe"] == "https://apt.grafana.com/dists/stable/Release"
    assert plan["grafana"]["bundle"] == "packages/grafana"
    assert plan["prometheus 2.54.1"]["probe"] == prometheus["url"]
    assert plan["prometheus 2.54.1"]["bundle"] == "binaries/" + PROMETHEUS


@pytest.mark.timeout(120)
def test_a_debian_node_with_dcgm_lists_the_image_and_no_archive(tmp_path):
    digest = "sha256:" + "7" * 64
    entries = sources(tmp_path, DEBIAN12, monitoring_dcgm_exporter=True, monitoring_server_grafana=False,
                      monitoring_dcgm_exporter_registry="registry.lan:5000/",
                      monitoring_dcgm_exporter_digest=digest,
                      monitoring_docker_binary="/opt/docker/bin/docker")
    reference = "registry.lan:5000/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@" + digest
    assert [(e["name"], e["kind"], e["url"], e["key"]) for e in entries] == [
        ("DCGM exporter image", "image", reference, "nvcr")]
    assert entries[0]["have"] == {"image": reference, "docker": "/opt/docker/bin/docker"}
    (source,) = sp.plan(entries)
    assert source["probe"] == "https://registry.lan:5000/v2/"
    assert source["bundle"] == "images/nvidia_k8s_dcgm-exporter_3.3.9-3.6.1-ubuntu22.04"


@pytest.mark.timeout(120)
def test_an_archive_already_downloaded_is_not_probed_and_a_mirror_replaces_github(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / PROMETHEUS).write_bytes(b"\x1f\x8b")
    entries = sources(tmp_path, EL7, _monitoring_release_cache=str(cache), monitoring_server_grafana=False,
                      monitoring_prometheus_archive_url="https://gh.lan/prometheus/prometheus/releases/download/"
                                                        "v2.54.1/" + PROMETHEUS,
                      monitoring_node_exporter_archive_url="https://gh.lan/prometheus/node_exporter/releases/"
                                                           "download/v1.5.0/" + NODE_EXPORTER)
    plan = dict((s["name"], s) for s in sp.plan(entries))
    assert sorted(plan) == ["node_exporter 1.5.0", "prometheus 2.54.1"]
    assert all(s["url"].startswith("https://gh.lan/") for s in plan.values())
    nothing = lambda argv: (1, "", "")  # noqa: E731 (no command is needed for a file check)
    assert sp.have(plan["prometheus 2.54.1"], nothing) is True
    assert sp.have(plan["node_exporter 1.5.0"], nothing) is False


# --- the playbook ----------------------------------------------------------------------------------------


def _list_tasks():
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), PLAYBOOK,
            "-i", "inventories/l20", "--list-tasks", "--tags", "monitoring"]
    result = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    plays, tasks = [], []
    for line in result.stdout.splitlines():
        if line.startswith("  play #"):
            plays.append(line.split(": ", 1)[1].split("\tTAGS:")[0])
        elif line.startswith("      ") and "\tTAGS: " in line:
            tasks.append((plays[-1], line.strip().split("\tTAGS: ")[0]))
    return plays, tasks


@pytest.mark.timeout(300)
def test_the_monitoring_playbook_probes_every_hosts_sources_before_its_first_change():
    bundle_import, probe_play, server_play, node_play = load_yaml(PLAYBOOK)
    plays = [probe_play, server_play, node_play]
    # an offline bundle is checked first, on the same hosts (playbooks/offline_bundle.yml, tagged bundle)
    assert bundle_import["ansible.builtin.import_playbook"] == "offline_bundle.yml"
    assert " ".join(bundle_import["vars"]["llmops_target"].split()) == " ".join(probe_play["hosts"].split())
    # the probe play covers both plays' hosts, and comes first of the monitoring tag's
    assert " ".join(probe_play["hosts"].split()) == server_play["hosts"] + ":" + node_play["hosts"]
    names, listed = _list_tasks()
    assert names[0].startswith("Verify the offline bundle before any change")
    names = names[1:]
    assert names == [p["name"] for p in plays]
    probe = "Probe the sources from the host and refuse the unreachable ones before any change"
    order = [name for _play, name in listed]
    assert order[:4] == ["Start the list of the sources this run fetches from (llmops_sources)",
                         "List Grafana's repository (monitoring host)",
                         "List the release archives and the DCGM exporter image (nodes and gateways)", probe]
    # what runs before the probe changes nothing (the entry points read and list); the roles come after
    by_name = dict((t["name"], t) for t in probe_play["tasks"])
    assert all(read_only(by_name[name]) for name in order[:3])
    assert all(play != probe_play["name"] for play, _name in listed[4:])
    (task,) = [t for t in probe_play["tasks"] if t["name"] == probe]
    assert task["ansible.builtin.include_role"]["tasks_from"] == "source_probe"
    assert "llmops_source_probe | default(true) | bool" in task["when"]


def _inventory(tmp_path):
    (tmp_path / "hosts.ini").write_text(
        "[llm_nodes]\nlocalhost ansible_connection=local\n[llm_monitoring]\n[llm_gateways]\n")
    return str(tmp_path / "hosts.ini")


def _run_monitoring(tmp_path, **settings):
    settings = dict({"ansible_facts": EL7, "ansible_python_interpreter": sys.executable,
                     "_monitoring_release_cache": str(tmp_path / "cache"), "llmops_source_probe_timeout": 5},
                    **settings)
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), PLAYBOOK, "--check",
            "-i", _inventory(tmp_path), "-e", "@%s" % (tmp_path / "vars.json")]
    return subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=150, check=False)


@pytest.mark.timeout(200)
def test_an_unreachable_release_mirror_stops_the_playbook_before_the_role_and_a_redirect_is_reached(tmp_path):
    """A release URL that github.com-style redirects to where the file is: reached. One on a closed port:
    the run stops in the probe play, naming it and its key; role monitoring never starts."""
    port = closed_port()
    release = "/prometheus/node_exporter/releases/download/v1.5.0/" + NODE_EXPORTER
    with SourceServer() as objects, SourceServer() as releases:
        releases.redirects[release] = objects.url + "/objects/" + PROMETHEUS + "?X-Amz-Signature=s"
        result = _run_monitoring(
            tmp_path, monitoring_prometheus_archive_url="http://127.0.0.1:%d/%s" % (port, PROMETHEUS),
            monitoring_node_exporter_archive_url=releases.url + release)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "1 source(s) this run needs cannot be reached from localhost" in out, out
    assert "- prometheus 2.54.1 (binary http://127.0.0.1:%d/%s): TCP connect to 127.0.0.1:%d failed" % (
        port, PROMETHEUS, port) in out
    assert ("set llmops_mirrors.github_releases to a mirror the node reaches or stage binaries/%s of the "
            "offline bundle" % PROMETHEUS) in out
    assert "node_exporter 1.5.0 (binary" not in out
    assert "Collect each node's figures" not in out            # the role's play never started


@pytest.mark.timeout(200)
def test_reachable_sources_let_the_playbook_go_on_and_the_switch_skips_the_probe(tmp_path):
    port = closed_port()
    with SourceServer() as releases:
        release = "/objects/" + PROMETHEUS
        result = _run_monitoring(tmp_path, monitoring_prometheus_archive_url=releases.url + release,
                                 monitoring_node_exporter_archive_url=releases.url + release)
        assert releases.seen == [release]                      # one source for both reasons: probed once
    out = result.stdout + result.stderr
    # past the probe, into the role (which stops at its own first read or refusal here: check mode, no
    # monitoring host, a test box perhaps without systemd)
    assert "binary prometheus 2.54.1 %s%s: reachable" % (releases.url, release) in " ".join(out.split()), out
    assert "cannot be reached" not in out
    assert "TASK [llmops.serving.monitoring : Load the settings of this operating system" in out, out

    skipped = _run_monitoring(tmp_path, llmops_source_probe=False,
                              monitoring_prometheus_archive_url="http://127.0.0.1:%d/%s" % (port, PROMETHEUS))
    out = skipped.stdout + skipped.stderr
    assert "cannot be reached" not in out and "TASK [llmops.serving.packages_common" not in out, out
    assert "TASK [llmops.serving.monitoring : Load the settings of this operating system" in out, out


@pytest.mark.timeout(120)
def test_the_mirrors_doc_says_the_monitoring_sources_are_refused_before_any_change(tmp_path):
    plan = sp.plan(sources(tmp_path, EL7, monitoring_dcgm_exporter=True))
    with open(os.path.join(ROOT, "docs", "mirrors.md"), encoding="utf-8") as handle:
        # the source plan's table: source, needed by, key, bundle entry, out of reach
        rows = [line.split(" | ") for line in handle.read().splitlines() if line.startswith("| ")]
    for source in plan:
        (row,) = [r for r in rows if len(r) == 5 and r[2] == "`%s`" % source["key"]]
        assert "refused before any change" in row[4], row
        name = source["bundle"].split("/", 1)[1]
        if source["kind"] == "binary":      # the row names the pattern and each archive
            assert "`binaries/<archive name>`" in row[3] and "`%s`" % name in row[3], (name, row)
        else:                               # the image's tag as <tag>
            assert "`%s`" % source["bundle"].replace("_3.3.9-3.6.1-ubuntu22.04", "_<tag>") in row[3], row


@pytest.mark.timeout(120)
def test_an_archive_the_offline_bundle_holds_is_taken_from_it_and_the_others_are_not(tmp_path):
    bundle = {"entries": ["binaries/" + PROMETHEUS, "models/x"], "images": [], "packages": []}
    entries = sources(tmp_path, EL7, llmops_bundle="/srv/llmops-bundle", llmops_bundle_sources=bundle)
    by_name = dict((e["name"], e) for e in entries)
    assert by_name["prometheus 2.54.1"]["url"] == "file:///srv/llmops-bundle/binaries/%s/%s" % (
        PROMETHEUS, PROMETHEUS)
    assert by_name["node_exporter 1.5.0"]["url"].startswith("https://github.com/")
    planned = sp.plan([by_name["prometheus 2.54.1"]])[0]
    assert sp.in_bundle(planned, bundle) == "binaries/" + PROMETHEUS
    # without a bundle, both from the release URLs
    entries = sources(tmp_path, EL7)
    assert all(e["url"].startswith("https://") for e in entries)
