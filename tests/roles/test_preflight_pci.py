# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Preflight sees the GPUs without a driver: the first task of playbooks/preflight.yml reads the PCI bus and
refuses a box that is not the one inventories/l20 describes (4x L20) before the GPU host stage installs a
driver. The task itself, as preflight.yml has it, runs here on fake sysfs trees."""

import os
import subprocess
import sys

import yaml

from tests.helpers import FIXTURES, ROOT, load_yaml, run_local_playbook

PREFLIGHT = os.path.join(ROOT, "playbooks", "preflight.yml")
L20 = os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "main.yml")
MAKE_TREE = os.path.join(FIXTURES, "fake_sysfs_pci", "make_tree.py")


def pci_task():
    play = load_yaml(PREFLIGHT)[0]
    return play["tasks"][0]


def test_preflight_reads_the_pci_bus_first_with_the_inventory_expectation():
    task = pci_task()
    assert task["llmops.serving.gpu_pci_info"] == {
        "sysfs_root": "{{ llmops_sysfs_root | default(omit) }}",
        "expected": "{{ llmops_gpu_expected | default(omit) }}"}
    assert task["check_mode"] is False  # a --check review refuses the wrong box too
    with open(os.path.join(ROOT, "site.yml")) as handle:
        stages = [p["ansible.builtin.import_playbook"] for p in yaml.safe_load(handle)]
    assert stages.index("playbooks/preflight.yml") < stages.index("playbooks/gpu_host.yml")


def test_the_l20_inventory_expects_four_l20():
    assert load_yaml(L20)["llmops_gpu_expected"] == {"count": 4, "names": ["L20"]}


def run_preflight_pci(tmp_path, *tree_args):
    root = tmp_path / "sys"
    subprocess.run([sys.executable, MAKE_TREE, str(root)] + list(tree_args), check=True,
                   stdout=subprocess.PIPE)
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "vars": {"llmops_sysfs_root": str(root),
                      "llmops_gpu_expected": load_yaml(L20)["llmops_gpu_expected"]},
             "tasks": [pci_task(), {"ansible.builtin.debug": {"msg": "{{ _preflight_pci.report }}"}}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    return run_local_playbook(path, str(tmp_path),
                              extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])


def test_the_l20_box_passes_and_says_nouveau_holds_its_gpus(tmp_path):
    result, stats = run_preflight_pci(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "PCI: 4x L20 (nouveau on 4)." in result.stdout and stats["failed"] == 0


def test_a_box_with_other_gpus_is_refused_before_the_driver_stage(tmp_path):
    result, stats = run_preflight_pci(tmp_path, "--device", "2684", "--class-id", "0x030000", "--gpus", "2")
    assert result.returncode != 0 and stats["failed"] == 1
    out = " ".join(result.stdout.split())
    assert "This is not the box the inventory describes" in out
    assert "expects 4 NVIDIA GPU(s) L20 (llmops_gpu_expected), the PCI bus shows 2" in out
    assert "2 GPU(s) are not L20" in out and "NVIDIA 10de:2684" in out
