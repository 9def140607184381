# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every systemd unit the collection writes, rendered with Ansible's own Templar for a node's systemd, scored
by this machine's `systemd-analyze security --offline=yes` (systemd 252, as CI's Debian 12): exposure <= 3.0
("OK") for 252 and for what 239 gets; only the settings 219 (CentOS 7) and 239 know in their renders; the
GPU device allow-list of an instance. The table is plugins/plugin_utils/systemd.py's HARDENING."""
import re
import shutil
import subprocess

import pytest

from tests.fixtures.systemd_keys import NEWER_THAN_239, SERVICE_KEYS_219, SERVICE_KEYS_239
from tests.roles import test_monitoring_role as monitoring
from tests.roles import test_ray_cluster_role as ray
from tests.roles.test_nvidia_driver import el7
from tests.roles.test_serving_unit import CPP, render_plan, render_unit, unit_sections, variables_for
from tests.roles.test_serving_vllm_unit import seed_vars

SYSTEMD = {219: "systemd 219\n+PAM +AUDIT", 239: "systemd 239 (239-82.el8)",
           252: "systemd 252 (252.38-1~deb12u1)"}
GPUS4 = {"present": True, "count": 4, "gpus": [{"index": i, "uuid": "GPU-%d" % i} for i in range(4)]}
CONTAINER_CPP = {"mode": "container", "image": "llmops/llama.cpp:b42", "build_id": "b42",
                 "binary": "/opt/llama.cpp/bin/llama-server"}
LIMIT = 3.0


# --- rendering every unit --------------------------------------------------------------------------

def _serving(version, gpus=(2, 3), cpp=CPP, **extra):
    v = variables_for([{"name": "q", "model": "tiny", "port": 18003, "gpus": list(gpus)}],
                      llmops_gpus=GPUS4, llmops_llama_cpp=cpp, systemctl=SYSTEMD[version], **extra)
    return render_unit(v)


def _vllm(version, mode="host"):
    v = seed_vars(serving_mode={"llama.cpp": "host", "vllm": mode},
                  serving_image={"llama.cpp": "", "vllm": "vllm/vllm-openai:v0.33.0"})
    return render_unit(render_plan(v, systemctl_version=SYSTEMD[version]))


def _monitoring(name):
    def render(version, tmp):
        _variables, templar = monitoring.node_plan(tmp, monitoring_dcgm_exporter=True,
                                                   _monitoring_systemd={"version_text": SYSTEMD[version]})
        return monitoring.render(templar, monitoring.NODE_ROLE, name)
    return render


def _persistenced(version, _tmp=None):
    return el7(nvidia_driver_install_method="runfile",
               _nvidia_driver_systemd_read={"version_text": SYSTEMD[version]}).template(
                   "nvidia-persistenced.service.j2")


def _ray(version, _tmp=None):
    variables = ray.role_vars(_ray_cluster_systemd={"version_text": SYSTEMD[version]})
    return ray.exec_start(variables)[1]


# unit file name -> render(version, tmp_path)
UNITS = {
    "llama-server-gpu.service": lambda version, _tmp=None: _serving(version),
    "llama-server-cpu.service": lambda version, _tmp=None: _serving(version, gpus=()),
    "llama-server-container.service": lambda version, _tmp=None: _serving(version, cpp=CONTAINER_CPP),
    "vllm-host.service": lambda version, _tmp=None: _vllm(version),
    "vllm-container.service": lambda version, _tmp=None: _vllm(version, mode="container"),
    "llmops-node-exporter.service": _monitoring("llmops-node-exporter.service.j2"),
    "llmops-prometheus-agent.service": _monitoring("llmops-prometheus-agent.service.j2"),
    "llmops-dcgm-exporter.service": _monitoring("llmops-dcgm-exporter.service.j2"),
    "llmops-gpu-metrics.service": _monitoring("llmops-gpu-metrics.service.j2"),
    "nvidia-persistenced.service": _persistenced,
    "ray.service": _ray,
}


def service_keys(text):
    return [key for key, _value in unit_sections(text).get("Service", [])]


# --- systemd-analyze ------------------------------------------------------------------------------

def systemd_analyze():
    path = shutil.which("systemd-analyze")
    if not path:
        pytest.fail("systemd-analyze is missing: these tests score the units with it. Install systemd "
                    "(Debian/Ubuntu: apt-get install systemd; EL: dnf install systemd) and run them again")
    return path


def exposure(tmp_path, name, text):
    """(exposure figure, return code, output) of `systemd-analyze security --offline=yes --threshold=30`."""
    path = tmp_path / name
    path.write_text(text)
    result = subprocess.run([systemd_analyze(), "security", "--offline=yes", "--threshold=30", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                            timeout=60, check=False)
    match = re.search(r"Overall exposure level for %s: (\d+\.\d)" % re.escape(name), result.stdout)
    assert match, result.stdout[-3000:]
    return float(match.group(1)), result.returncode, result.stdout


def verify_problems(tmp_path, name, text):
    """What `systemd-analyze verify` says of the unit's own lines: everything but the programs that exist on
    a node and not on this machine."""
    path = tmp_path / name
    path.write_text(text)
    result = subprocess.run([systemd_analyze(), "verify", "--man=no", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True, timeout=60, check=False)
    benign = re.compile(r": Command \S+ is not executable: No such file or directory$|^\s*$")
    return [line for line in result.stdout.splitlines() if not benign.search(line)]


def strip_hardening(text):
    """The unit without the table's directives: what it scored before the sandbox."""
    from ansible_collections.llmops.serving.plugins.plugin_utils.systemd import HARDENING
    keys = {row[0] for row in HARDENING} | {"DeviceAllow", "ReadWritePaths"}
    return "\n".join(line for line in text.splitlines() if line.partition("=")[0] not in keys) + "\n"


@pytest.mark.parametrize("name", sorted(UNITS))
@pytest.mark.parametrize("version", [252, 239])
def test_every_unit_is_ok_for_systemd_analyze_security(tmp_path, name, version):
    text = UNITS[name](version, tmp_path)
    figure, rc, output = exposure(tmp_path, name, text)
    print("%s (systemd %d): exposure %.1f" % (name, version, figure))
    assert figure <= LIMIT and rc == 0, output
    # the other direction: the same unit without the table's settings is not OK
    bare, bare_rc, _output = exposure(tmp_path, name, strip_hardening(text))
    print("%s (systemd %d) without the sandbox: exposure %.1f" % (name, version, bare))
    assert bare > LIMIT and bare_rc != 0
    assert verify_problems(tmp_path, name, text) == []


def test_hardening_switched_off_scores_above_the_limit(tmp_path):
    text = _serving(252, serving_hardening=False)
    figure, rc, _output = exposure(tmp_path, "llama-server-off.service", text)
    assert figure > LIMIT and rc != 0
    assert "SystemCallFilter" not in text and "DeviceAllow" not in text and "ProtectSystem" not in text


def test_verify_reports_a_bad_line(tmp_path):
    """verify_problems() sees what it is there for: a setting the node's systemd would skip."""
    text = UNITS["llama-server-gpu.service"](252)
    text = text.replace("[Service]\n", "[Service]\nProtectKernelTunabels=yes\n")
    assert any("ProtectKernelTunabels" in line for line in verify_problems(tmp_path, "bad.service", text))


# --- what 219 and 239 know ------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(UNITS))
@pytest.mark.parametrize("version,known", [(219, SERVICE_KEYS_219), (239, SERVICE_KEYS_239)])
def test_a_render_holds_only_what_its_systemd_knows(tmp_path, name, version, known):
    keys = service_keys(UNITS[name](version, tmp_path))
    assert set(keys) - known == set(), "systemd %d does not know these" % version
    if version == 239:
        assert "SystemCallFilter" in keys and "ProtectSystem" in keys
    if version == 219:
        assert "SystemCallFilter" not in keys          # groups (@system-service) are 231/239
        assert "NoNewPrivileges" in keys and "CapabilityBoundingSet" in keys


def test_the_table_versions_agree_with_the_manual_pages():
    from ansible_collections.llmops.serving.plugins.plugin_utils.systemd import HARDENING
    for directive, since, _values, why in HARDENING:
        assert why.strip(), directive
        if directive in NEWER_THAN_239:
            assert since > 239, directive
        elif directive not in SERVICE_KEYS_239:
            pytest.fail("%s is in no list of tests/fixtures/systemd_keys.py" % directive)
        elif directive not in SERVICE_KEYS_219:
            assert 219 < since <= 239, directive
        else:
            assert since <= 239, directive


def test_a_render_for_a_newer_systemd_keeps_the_newer_settings(tmp_path):
    keys_252 = set(service_keys(UNITS["llama-server-gpu.service"](252)))
    keys_239 = set(service_keys(UNITS["llama-server-gpu.service"](239)))
    assert {"ProtectClock", "ProtectKernelLogs", "ProtectProc", "RestrictSUIDSGID"} <= keys_252 - keys_239


# --- the GPU allow-list ---------------------------------------------------------------------------

def device_allow(text):
    return [v for k, v in unit_sections(text)["Service"] if k == "DeviceAllow"]


def test_an_instance_on_gpus_2_and_3_opens_those_and_the_control_nodes_only():
    allowed = device_allow(_serving(252, gpus=(3, 2), serving_gpu_isolation=True))
    paths = [entry.split()[0] for entry in allowed]
    assert "/dev/nvidia2" in paths and "/dev/nvidia3" in paths
    assert "/dev/nvidia0" not in paths and "/dev/nvidia1" not in paths
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(paths)
    assert [p for p in paths if re.fullmatch(r"/dev/nvidia\d+", p)] == ["/dev/nvidia2", "/dev/nvidia3"]
    assert not any("*" in p for p in paths)
    service = dict(unit_sections(_serving(252, gpus=(3, 2), serving_gpu_isolation=True))["Service"])
    assert service["DevicePolicy"] == "closed" and "PrivateDevices" not in service
    # systemd 219 gets the same allow-list (DevicePolicy= and DeviceAllow= are 208)
    assert device_allow(_serving(219, gpus=(2, 3), serving_gpu_isolation=True)) == allowed


def test_by_default_a_gpu_instance_may_open_nvidias_gpu_nodes_only_and_keeps_the_nodes_numbers():
    """serving_gpu_isolation off (the default until checked on real GPUs): the allow-list is NVIDIA's
    character devices and nothing else; CUDA_VISIBLE_DEVICES and the nvidia-smi check keep the node's
    indexes, as they were before the sandbox."""
    text = _serving(252, gpus=(3, 2))
    assert device_allow(text) == ["char-nvidia* rw"]
    service = unit_sections(text)["Service"]
    assert dict(service)["DevicePolicy"] == "closed" and "PrivateDevices" not in dict(service)
    assert '"CUDA_VISIBLE_DEVICES=3,2"' in [v for k, v in service if k == "Environment"]
    assert any(" -i 3,2 " in v for k, v in service if k == "ExecStartPre")
    assert device_allow(_serving(252, gpus=())) == []


def test_a_cpu_only_instance_opens_no_gpu():
    text = _serving(252, gpus=())
    assert device_allow(text) == []
    service = dict(unit_sections(text)["Service"])
    assert service["DevicePolicy"] == "closed" and service["PrivateDevices"] == "yes"


def test_a_container_instance_needs_only_the_docker_socket():
    text = _serving(252, cpp=CONTAINER_CPP, serving_gpu_check=False)
    service = dict(unit_sections(text)["Service"])
    assert device_allow(text) == [] and service["PrivateDevices"] == "yes"
    assert service["RestrictAddressFamilies"] == "AF_UNIX"
    assert service["CapabilityBoundingSet"] == "" and service["MemoryDenyWriteExecute"] == "yes"
    # the GPU check before docker run (nvidia-smi in the unit) opens the instance's GPUs, numbered from 0
    text = _serving(252, cpp=CONTAINER_CPP, serving_gpu_isolation=True)
    assert [a.split()[0] for a in device_allow(text) if re.fullmatch(r"/dev/nvidia\d+ rw", a)] == [
        "/dev/nvidia2", "/dev/nvidia3"]
    assert "PrivateDevices" not in dict(unit_sections(text)["Service"])
    pre = [v for k, v in unit_sections(text)["Service"] if k == "ExecStartPre" and "nvidia-smi" in v]
    assert pre and " -i 0,1 " in pre[0]


def test_inside_the_sandbox_the_gpus_are_numbered_from_0_in_the_nodes_order():
    for gpus, local in (((2, 3), "0,1"), ((3, 2), "1,0"), ((0, 1, 2, 3), "0,1,2,3"), ((1,), "0")):
        text = _serving(252, gpus=gpus, serving_gpu_isolation=True)
        env = [v for k, v in unit_sections(text)["Service"] if k == "Environment"]
        assert '"CUDA_VISIBLE_DEVICES=%s"' % local in env, (gpus, env)
        pre = [v for k, v in unit_sections(text)["Service"] if k == "ExecStartPre"]
        assert any(" -i %s " % local in v for v in pre), (gpus, pre)
    # hardening off: no allow-list, the node's numbers
    text = _serving(252, gpus=(3, 2), serving_hardening=False)
    env = [v for k, v in unit_sections(text)["Service"] if k == "Environment"]
    assert '"CUDA_VISIBLE_DEVICES=3,2"' in env
    assert device_allow(text) == []


def test_units_that_run_cuda_or_python_jit_go_without_memory_deny_write_execute(tmp_path):
    for name in ("llama-server-gpu.service", "llama-server-cpu.service", "vllm-host.service", "ray.service",
                 "llmops-gpu-metrics.service", "nvidia-persistenced.service"):
        assert "MemoryDenyWriteExecute" not in service_keys(UNITS[name](252, tmp_path)), name
    for name in ("llama-server-container.service", "llmops-node-exporter.service"):
        assert "MemoryDenyWriteExecute" in service_keys(UNITS[name](252, tmp_path)), name


def test_a_bad_gpu_index_is_refused():
    from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError
    from ansible_collections.llmops.serving.plugins.plugin_utils.systemd import devices, unit_hardening
    with pytest.raises(ServingError, match="not a number"):
        devices("gpu-server", ["0 rwm\nDevicePolicy=auto"])
    with pytest.raises(ServingError, match="unknown hardening profile"):
        unit_hardening(252, "web")
    with pytest.raises(ServingError, match="ReadWritePaths"):
        unit_hardening(252, "exporter", write_paths=["/var/lib/x y"])
