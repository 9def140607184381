# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The L20 site's mirrors file (inventories/l20/group_vars/l20/mirrors.yml): one map, llmops_mirrors, feeds
each role's own variable. Rendered with Ansible's Templar: an empty map gives exactly the role defaults
(the file's fallbacks cannot drift from them), a full map gives only mirror URLs, every fed variable is a
documented role variable, and docs/mirrors.md documents every key."""
import glob
import os

import pytest

from tests.helpers import ROOT, load_yaml, role_templar

MIRRORS = os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "mirrors.yml")
DOC = os.path.join(ROOT, "docs", "mirrors.md")
FULL = {
    "hf": "https://hf.lan", "modelscope": "https://ms.lan", "registry": "registry.lan:5000",
    "docker_hub_mirrors": ["https://hub.lan"], "pypi": "https://pypi.lan/simple",
    "pypi_extra": ["https://torch.lan/cu124"], "llama_cpp_git": "https://git.lan/llama.cpp.git",
    "ubuntu_apt": "https://ubuntu.lan/ubuntu",
    "centos_vault": "https://vault.lan/7.9.2009", "epel_archive": "https://epel.lan/archive/epel/",
    "nvidia_cuda": "https://cuda.lan/repos", "libnvidia_container": "https://nct.lan",
    "docker_ce": "https://docker-ce.lan", "github_releases": "https://gh.lan/", "nvcr": "nvcr.lan:5000",
    "grafana": "https://grafana-apt.lan",
}
FACTS = {"_nvidia_driver_cuda_distro": "debian12"}


def role_defaults():
    """{variable: (role dir, default expression)} of every role."""
    out = {}
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "main.yml")):
        role = os.path.dirname(os.path.dirname(path))
        for name, value in load_yaml(path).items():
            out[name] = (role, value)
    return out


def fed_variables():
    return dict((k, v) for k, v in load_yaml(MIRRORS).items() if k != "llmops_mirrors")


def role_variables(name):
    """FACTS and the other defaults of name's role (a fed URL may name the role's pinned version)."""
    role, _ = role_defaults()[name]
    defaults = load_yaml(os.path.join(role, "defaults", "main.yml"))
    defaults.pop(name)
    return role, dict(defaults, **FACTS)


def render(name, expression, mirrors):
    role, variables = role_variables(name)
    return role_templar(role, dict(variables, llmops_mirrors=mirrors)).template(expression)


def test_every_fed_variable_is_a_documented_role_variable():
    defaults = role_defaults()
    for name in fed_variables():
        assert name in defaults, "%s is no role's variable" % name
        role = defaults[name][0]
        specs = load_yaml(os.path.join(role, "meta", "argument_specs.yml"))["argument_specs"]["main"]
        specs = specs["options"]
        assert name in specs, "%s is not in %s's argument_specs" % (name, os.path.basename(role))


EMPTY = dict((k, "" if isinstance(v, str) else []) for k, v in FULL.items())


@pytest.mark.parametrize("mirrors", [{}, EMPTY])
def test_no_mirror_set_gives_the_role_defaults(mirrors):
    defaults = role_defaults()
    for name, expression in fed_variables().items():
        role, variables = role_variables(name)
        want = role_templar(role, variables).template(defaults[name][1])
        assert render(name, expression, mirrors) == want, name


def test_the_l20_map_sets_the_hugging_face_mirror_of_the_seed_notes():
    mirrors = load_yaml(MIRRORS)["llmops_mirrors"]
    assert sorted(mirrors) == sorted(FULL)
    assert render("model_hf_endpoint", fed_variables()["model_hf_endpoint"], mirrors) == "https://hf-mirror.com"


def test_a_full_map_points_every_fed_variable_at_a_mirror():
    got = dict((name, render(name, expr, FULL)) for name, expr in fed_variables().items())
    assert got["llama_cpp_cuda_image_registry"] == got["vllm_image_registry"] == "registry.lan:5000"
    smoke = got["nvidia_container_toolkit_smoke_test_image"]
    assert smoke == "registry.lan:5000/nvidia/cuda:12.4.1-base-ubuntu22.04"
    assert got["nvidia_container_toolkit_daemon_options"] == {"registry-mirrors": ["https://hub.lan"]}
    assert got["el7_bootstrap_epel_baseurl"] == "https://epel.lan/archive/epel/7/$basearch/"
    assert got["nvidia_driver_apt_repo_url"] == "https://cuda.lan/repos/debian12/x86_64"
    assert got["nvidia_driver_el7_repo_url"] == "https://cuda.lan/repos/rhel7/x86_64"
    assert got["vllm_extra_index_urls"] == ["https://torch.lan/cu124"]
    assert got["monitoring_prometheus_archive_url"] == (
        "https://gh.lan/prometheus/prometheus/releases/download/v2.54.1/prometheus-2.54.1.linux-amd64.tar.gz")
    assert got["monitoring_node_exporter_archive_url"] == (
        "https://gh.lan/prometheus/node_exporter/releases/download/v1.5.0/node_exporter-1.5.0.linux-amd64.tar.gz")
    assert got["monitoring_dcgm_exporter_registry"] == "nvcr.lan:5000"
    assert got["monitoring_server_grafana_apt_repo_url"] == "https://grafana-apt.lan"
    upstream = ("huggingface.co", "nvidia.com", "github", "docker.com", "centos.org", "fedoraproject",
                "pypi.org", "nvcr.io", "grafana.com")
    for name, value in got.items():
        assert not any(u in str(value) for u in upstream), (name, value)


def test_docs_name_every_key_and_every_fed_variable():
    with open(DOC, encoding="utf-8") as handle:
        doc = handle.read()
    for key in FULL:
        assert "`%s`" % key in doc, key
    for name in fed_variables():
        assert name in doc, name
