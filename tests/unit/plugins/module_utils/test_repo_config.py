# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which EL 7 repository files el7_bootstrap rewrites (plugins/module_utils/_software/repo_config.py): a
working file is
left alone, one that is absent, names a dead mirror list or has a failing baseurl is rewritten, saying why."""
import pytest
from ansible_collections.llmops.serving.plugins.module_utils._software import repo_config as rc

VAULT = "https://mirrors.aliyun.com/centos-vault/7.9.2009/os/$basearch/"
BASE = ("[base]\nname=CentOS-7 - Base\nbaseurl=%s\ngpgcheck=1\n\n[updates]\nbaseurl=%s\n\n"
        "[centosplus]\nbaseurl=http://dead.lan/plus/\nenabled=0\n"
        % (VAULT, VAULT.replace("/os/", "/updates/")))


def test_a_working_file_is_left_alone_and_says_so():
    answers = {VAULT: 200, VAULT.replace("/os/", "/updates/"): 200}
    rewrite, reason = rc.decide("CentOS-Base.repo", BASE, "write", answers)
    assert not rewrite
    assert reason == "CentOS-Base.repo answers from the node (base, updates): left as it is"


@pytest.mark.parametrize("status, what", [(0, "no answer"), (404, "HTTP 404")])
def test_a_failing_enabled_baseurl_rewrites_the_file_naming_section_and_url(status, what):
    answers = {VAULT: 200, VAULT.replace("/os/", "/updates/"): status}
    rewrite, reason = rc.decide("CentOS-Base.repo", BASE, "write", answers)
    assert rewrite
    assert reason == "CentOS-Base.repo [updates] baseurl %s failed from the node (%s)" % (
        VAULT.replace("/os/", "/updates/"), what)


def test_a_disabled_section_is_not_probed_nor_counted():
    assert rc.probe_urls({"CentOS-Base.repo": BASE}) == [VAULT, VAULT.replace("/os/", "/updates/")]


def test_a_dead_mirrorlist_rewrites_even_a_file_the_site_wrote():
    text = "[epel]\nmetalink=https://mirrors.fedoraproject.org/metalink?repo=epel-7&arch=$basearch\n"
    rewrite, reason = rc.decide("epel.repo", text, "dead-mirrorlist", {})
    assert rewrite and "[epel] uses metalink=https://mirrors.fedoraproject.org" in reason


def test_a_site_file_in_dead_mirrorlist_mode_is_kept_even_when_its_baseurl_fails():
    text = "[centos-sclo-sclo]\nbaseurl=http://my.lan/sclo/\n"
    rewrite, _ = rc.decide("CentOS-SCLo-scl.repo", text, "dead-mirrorlist", {"http://my.lan/sclo/": 0})
    assert not rewrite


def test_an_absent_file_or_one_without_a_baseurl_is_written():
    assert rc.decide("epel.repo", None, "write", {}) == (True, "epel.repo is absent")
    assert rc.decide("epel.repo", "[epel]\nenabled=1\n", "write", {})[0]


def test_the_plan_keeps_the_roles_order_and_the_node_output_is_parsed():
    read = ("LLMOPS_FILE CentOS-Base.repo present\n%sLLMOPS_END\nLLMOPS_FILE epel.repo absent\n"
            "LLMOPS_MISSING dkms\nLLMOPS_READ\n" % BASE)
    probe = "LLMOPS_PROBE 200 %s\nLLMOPS_PROBE 000 %s\nLLMOPS_PROBED\n" % (
        VAULT, VAULT.replace("/os/", "/updates/"))
    files, _ = rc.parse_node_output(read)
    _, answers = rc.parse_node_output(probe)
    assert files["epel.repo"] is None and rc.sections(files["CentOS-Base.repo"])["base"]["baseurl"] == VAULT
    plan = rc.plan(files, [("CentOS-Base.repo", "write"), ("epel.repo", "write")], answers)
    assert [(p["file"], p["rewrite"]) for p in plan] == [("CentOS-Base.repo", True), ("epel.repo", True)]
    answers[VAULT.replace("/os/", "/updates/")] = 200
    plan = rc.plan(files, [("CentOS-Base.repo", "write"), ("epel.repo", "write")], answers)
    assert [(p["file"], p["rewrite"]) for p in plan] == [("CentOS-Base.repo", False), ("epel.repo", True)]
