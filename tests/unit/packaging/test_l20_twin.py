# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The L20 twin (molecule/l20) runs the shipped inventories/l20 as it is, plus one override file.

The override may only say how to reach the host, where the mirrors point, and what a GPU-less machine cannot
avoid. Any other key would make the twin test something other than what the user runs: it fails here.
"""
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TWIN = os.path.join(ROOT, "molecule", "l20")
SHIPPED = os.path.join(ROOT, "inventories", "l20")

# Every key the override may set, by the reason it may.
ALLOWED = {
    "how to reach the host": {"ansible_connection", "ansible_host", "ansible_user", "ansible_port",
                              "ansible_become", "ansible_become_user", "ansible_docker_extra_args"},
    "where the mirrors point": {"llmops_mirrors", "nvidia_driver_apt_repo_trusted",
                                "nvidia_container_toolkit_apt_repo_trusted"},
    # The CUDA build itself is the shipped one (llama_cpp_cuda, the architectures, the mode): only the two
    # base images are stand-ins (tests/images/cuda.sh), local images with no registry digest.
    "the CUDA 12.4.1 base images, stand-ins built from Debian's toolkit": {
        "llama_cpp_builder_image", "llama_cpp_runtime_image",
        "llama_cpp_builder_image_digest", "llama_cpp_runtime_image_digest"},
    "the fake vLLM image": {"vllm_image_digest"},
    "the stand-in driver stack and GPUs": {
        "nvidia_driver_sysfs_module_dir", "nvidia_driver_reboot_boot_time_command", "llmops_sysfs_root"},
}
ALLOWED_KEYS = set().union(*ALLOWED.values())


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def override():
    return load(os.path.join(TWIN, "inventory.yml"))


def test_the_override_sets_host_variables_of_the_one_shipped_host_only():
    data = override()
    assert set(data) == {"all"}
    assert set(data["all"]) == {"children"}
    assert set(data["all"]["children"]) == {"l20"}
    group = data["all"]["children"]["l20"]
    assert set(group) == {"hosts"}, "no group variables: they would rank below the shipped group_vars"
    shipped = load(os.path.join(SHIPPED, "hosts.yml"))
    shipped_hosts = shipped["all"]["children"]["llm_nodes"]["children"]["l20"]
    assert set(group["hosts"]) == set(shipped_hosts["hosts"]) == {"l20-node-01"}


def test_every_override_key_is_on_the_allow_list():
    keys = set(override()["all"]["children"]["l20"]["hosts"]["l20-node-01"])
    assert keys - ALLOWED_KEYS == set(), "not allowed in the override: %s" % sorted(keys - ALLOWED_KEYS)


def bundle_override():
    return load(os.path.join(TWIN, "inventory-bundle.yml"))


def test_the_bundle_override_is_the_same_shipped_host_on_the_second_box_with_no_mirror_set():
    """The run from the offline bundle (bundle.yml): the shipped host, played by the platform l20-node-bundle,
    every mirror empty (the shipped hf-mirror too), and otherwise only what inventory.yml may set."""
    data = bundle_override()
    assert set(data) == {"all"} and set(data["all"]["children"]) == {"l20"}
    hosts = data["all"]["children"]["l20"]["hosts"]
    assert set(hosts) == {"l20-node-01"}
    host = hosts["l20-node-01"]
    assert set(host) - ALLOWED_KEYS == set(), sorted(set(host) - ALLOWED_KEYS)
    shipped = load(os.path.join(SHIPPED, "group_vars", "l20", "mirrors.yml"))["llmops_mirrors"]
    assert set(host["llmops_mirrors"]) == set(shipped)
    assert [key for key, value in host["llmops_mirrors"].items() if value] == []
    platforms = {p["name"]: p for p in load(os.path.join(TWIN, "molecule.yml"))["platforms"]}
    assert host["ansible_host"] == "l20-node-bundle" in platforms
    # the bundle is mounted read-only where the run's -e llmops_bundle points
    assert any(v.endswith(":/srv/llmops-bundle:ro") for v in platforms["l20-node-bundle"]["volumes"])
    with open(os.path.join(TWIN, "bundle.yml"), encoding="utf-8") as handle:
        assert "'llmops_bundle=/srv/llmops-bundle'" in handle.read()
    # the build identity's inputs are the staging node's (its image is installed as it is)
    main = override()["all"]["children"]["l20"]["hosts"]["l20-node-01"]
    for key in ("llama_cpp_builder_image_digest", "llama_cpp_runtime_image_digest"):
        assert host[key] == main[key]


def test_the_mirrors_map_has_the_shipped_keys_only():
    mirrors = override()["all"]["children"]["l20"]["hosts"]["l20-node-01"]["llmops_mirrors"]
    shipped = load(os.path.join(SHIPPED, "group_vars", "l20", "mirrors.yml"))["llmops_mirrors"]
    assert set(mirrors) == set(shipped)


def test_the_twin_runs_the_users_command_on_the_shipped_inventory():
    argv = load(os.path.join(TWIN, "vars", "main.yml"))["l20_playbook_argv"]
    assert argv[1:6] == ["site.yml", "-i", "inventories/l20", "-i", "molecule/l20/inventory.yml"]
    # Beyond the override: only the test vault (extra variables that hold vault_serving_api_keys alone).
    assert argv[6] == "-e" and argv[7].endswith("/vault.yml") and argv[8] == "--vault-password-file"
    assert len(argv) == 10
    with open(os.path.join(TWIN, "prepare.yml"), encoding="utf-8") as handle:
        prepare = handle.read()
    written = re.findall(r"printf '([a-z_]+):", prepare)
    assert written == ["vault_serving_api_keys"]


def test_no_inventory_file_of_the_twin_beside_the_override():
    inventories = [name for name in os.listdir(TWIN) if name.endswith((".yml", ".yaml", ".ini"))
                   and name not in ("molecule.yml", "prepare.yml", "converge.yml", "side_effect.yml",
                                    "verify.yml", "verify_node.yml", "cleanup.yml", "inventory.yml",
                                    "inventory-bundle.yml", "bundle.yml")]
    assert inventories == []
    assert not os.path.exists(os.path.join(TWIN, "group_vars"))
    assert not os.path.exists(os.path.join(TWIN, "host_vars"))


def test_the_ccache_mount_is_where_the_inventory_keeps_its_ccache():
    molecule = load(os.path.join(TWIN, "molecule.yml"))
    mounts = [v.split(":")[1] for v in molecule["platforms"][0]["volumes"] if "/ccache:" in v]
    shipped = load(os.path.join(SHIPPED, "group_vars", "l20", "main.yml"))
    defaults = load(os.path.join(ROOT, "roles", "llama_cpp", "defaults", "main.yml"))
    assert mounts == [shipped.get("llama_cpp_ccache_dir", defaults["llama_cpp_ccache_dir"])]


def test_the_twin_compiles_the_shipped_cuda_build_in_the_stand_in_images():
    """No CPU substitution: llama_cpp_cuda, the architectures and the build mode come from the shipped
    inventory (CUDA for sm_89 in a container), and the images swapped in are the CUDA 12.4.1 stand-ins."""
    host = override()["all"]["children"]["l20"]["hosts"]["l20-node-01"]
    shipped = load(os.path.join(SHIPPED, "group_vars", "l20", "main.yml"))
    assert shipped["llama_cpp_cuda"] is True and shipped["llama_cpp_cuda_architectures"] == ["89"]
    assert shipped["llama_cpp_build_mode"] == "container"
    for key in ("llama_cpp_cuda", "llama_cpp_cuda_architectures", "llama_cpp_build_mode",
                "llama_cpp_cmake_extra_options"):
        assert key not in host
    # The shipped image names (nvidia/cuda:<the role's tags>) in the twin's registry, by the digests its push
    # gave: prepare pushes the stand-ins under exactly those names.
    assert "llama_cpp_builder_image" not in host and "llama_cpp_runtime_image" not in host
    defaults = load(os.path.join(ROOT, "roles", "llama_cpp", "defaults", "main.yml"))
    with open(os.path.join(TWIN, "prepare.yml"), encoding="utf-8") as handle:
        prepare = yaml.safe_load(handle)
    serve = [task for play in prepare for task in play.get("tasks", [])
             if task.get("ansible.builtin.include_tasks") == "../shared/mirrors/serve.yml"]
    assert len(serve) == 1
    pushed = {image["source"]: image["name"] for image in serve[0]["vars"]["mirrors_images"]}
    repository = defaults["llama_cpp_cuda_image_repository"]
    names = {role: "%s:%s" % (repository, defaults["llama_cpp_%s_image_tag" % role])
             for role in ("builder", "runtime")}
    assert pushed == {"llmops-test/cuda:12.4.1-devel": names["builder"],
                      "llmops-test/cuda:12.4.1-runtime": names["runtime"]}
    for role in ("builder", "runtime"):
        assert "/mirrors/digests.yml" in host["llama_cpp_%s_image_digest" % role]
        assert "['%s']" % names[role] in host["llama_cpp_%s_image_digest" % role]
    with open(os.path.join(ROOT, "tests", "images", "cuda.sh"), encoding="utf-8") as handle:
        recipe = handle.read()
    assert '"$repo:12.4.1-devel"' in recipe and '"$repo:12.4.1-runtime"' in recipe


def test_the_node_has_no_route_out_and_reaches_the_mirrors_the_override_names():
    """The node's only network is internal (no route out); every URL of the override is the mirrors' address
    on it (or the registry on loopback, which the host's daemon pulls from and the node reaches through a
    forward to the host), and those are its allow-list."""
    molecule = load(os.path.join(TWIN, "molecule.yml"))
    platform = molecule["platforms"][0]
    assert "network_mode" not in platform
    assert [net["name"] for net in platform["networks"]] == ["llmops-l20-noroute"]
    (network,) = platform["docker_networks"]
    assert network["name"] == "llmops-l20-noroute" and network["internal"] is True
    gateway = network["ipam_config"][0]["gateway"]
    twin_vars = load(os.path.join(TWIN, "vars", "main.yml"))
    assert twin_vars["mirrors_bind"] == gateway
    allowed = {(gateway, port) for port in twin_vars["mirrors_allow"][0]["ports"]}
    mirrors = override()["all"]["children"]["l20"]["hosts"]["l20-node-01"]["llmops_mirrors"]
    reached = set()
    for key, value in mirrors.items():
        if not value:
            continue
        if key == "registry":
            # the host's daemon pulls from loopback; the node reaches the same port on the host through the
            # forward from its own loopback (mirrors_registry_forward)
            assert value.startswith("127.0.0.1:")
            assert twin_vars["mirrors_registry_forward"] in (gateway, "{{ mirrors_bind }}")
            reached.add((gateway, int(value.split(":")[1])))
            continue
        match = re.fullmatch(r"(?:https?|git)://([0-9.]+):([0-9]+)(?:/.*)?", value)
        assert match, "%s: %s is not a mirror on the no-route network" % (key, value)
        reached.add((match.group(1), int(match.group(2))))
    assert reached == allowed


# The twin's own plays (verify, side_effect) run outside the roles: a role's defaults are not loaded there, so
# a role variable they read must come from the inventories (the shipped one or the override) or carry a
# default. (verify read llama_cpp_builder_image after the override stopped setting it: undefined at run time.)
ROLE_VARIABLE = re.compile(r"\b(?:%s)_[a-z0-9_]+" % "|".join(
    sorted(os.listdir(os.path.join(ROOT, "roles")), key=len, reverse=True)))


def unset_role_variables(text, defined):
    """The role variables text reads (YAML comments aside) that defined lacks and no `| default(` follows (a
    mapping key, `name:`, sets one: the extra variables a play passes to the role's own playbook)."""
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return sorted({match.group(0) for match in ROLE_VARIABLE.finditer(text)
                   if match.group(0) not in defined
                   and not re.match(r"\s*\|\s*default\(|:\s", text[match.end():])})


def inventory_variables():
    defined = set(override()["all"]["children"]["l20"]["hosts"]["l20-node-01"])
    for folder in ("group_vars", "host_vars"):
        for base, _dirs, files in os.walk(os.path.join(SHIPPED, folder)):
            for name in files:
                if name.endswith(".yml"):
                    defined |= set(load(os.path.join(base, name)) or {})
    return defined


def test_unset_role_variables_finds_a_role_variable_the_inventories_lack():
    defined = {"llama_cpp_build_root"}
    text = ("argv: ['{{ llama_cpp_builder_image }}', '{{ llama_cpp_build_root }}']\n"
            "# llama_cpp_git in a comment\n")
    assert unset_role_variables(text, defined) == ["llama_cpp_builder_image"]
    assert unset_role_variables("x: '{{ llama_cpp_install_root | default(\"/opt\") }}'", defined) == []
    assert unset_role_variables(text, defined | {"llama_cpp_builder_image"}) == []
    assert unset_role_variables("vars:\n  bundle_packages: [x]\n", defined) == []
    assert unset_role_variables("x: '{{ bundle_packages }}'\n", defined) == ["bundle_packages"]


def test_the_twins_own_plays_read_no_role_variable_the_inventories_lack():
    defined = inventory_variables()
    for name in ("verify.yml", "verify_node.yml", "side_effect.yml", "converge.yml", "cleanup.yml",
                 "bundle.yml"):
        with open(os.path.join(TWIN, name), encoding="utf-8") as handle:
            assert unset_role_variables(handle.read(), defined) == [], name
