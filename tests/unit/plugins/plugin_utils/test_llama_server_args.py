"""The llama-server flag table: settings -> argv, GPU mapping, refusals, systemd spellings."""
import json
import shlex

import pytest
from ansible_collections.llmops.serving.plugins.module_utils import llama_server_args as lsa
from ansible_collections.llmops.serving.plugins.module_utils.llama_server_args import LlamaServerArgsError

MODELS = {"tiny": {"path": "/home/models/tiny/tiny.gguf", "sha256": "ab" * 32}}
GPUS = {"present": True, "count": 4,
        "gpus": [{"index": i, "uuid": "GPU-%08d-aaaa-bbbb-cccc-dddddddddddd" % i, "memory_total_mib": 46068}
                 for i in range(4)]}
HOST_CPP = {"mode": "host", "binary": "/opt/llama.cpp/builds/b1/bin/llama-server", "build_id": "b1"}


def pairs(argv):
    """argv -> {flag: value or True}; fails on a flag given twice."""
    out = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("-"), argv
        assert flag not in out, "flag %s given twice in %s" % (flag, argv)
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[flag] = argv[i + 1]
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def plan(instances, **kw):
    kw.setdefault("llama_cpp", HOST_CPP)
    kw.setdefault("models", MODELS)
    return lsa.plan_instances(instances, **kw)


def test_every_setting_kind_renders():
    argv = lsa.build_argv({
        "ctx_size": 4096, "kv_unified": False, "cont_batching": True, "flash_attn": True, "reasoning": False,
        "tensor_split": [3, 1], "metrics": False, "temp": 0.7, "chat_template_kwargs": {"b": 1, "a": "x"},
        "spec_type": ["draft-mtp", "ngram-mod"],
    })
    got = pairs(argv)
    assert got["--ctx-size"] == "4096"
    assert got["--no-kv-unified"] is True and "--kv-unified" not in got
    assert got["--cont-batching"] is True
    assert got["--flash-attn"] == "on" and got["--reasoning"] == "off"
    assert got["--tensor-split"] == "3,1"
    assert "--metrics" not in got
    assert got["--temp"] == "0.7"
    assert json.loads(got["--chat-template-kwargs"]) == {"a": "x", "b": 1}
    assert got["--spec-type"] == "draft-mtp,ngram-mod"


@pytest.mark.parametrize("mmap,mlock,mode", [
    (False, True, "mlock"), (True, True, "mmap+mlock"), (False, False, "none"), (True, False, "mmap"),
    (None, True, "mmap+mlock"),
])
def test_mmap_mlock_fold_into_load_mode(mmap, mlock, mode):
    settings = {"mlock": mlock}
    if mmap is not None:
        settings["mmap"] = mmap
    got = pairs(lsa.build_argv(settings))
    assert got == {"--load-mode": mode}
    assert lsa.uses_mlock(settings) == mode.endswith("mlock")


def test_load_mode_and_mmap_together_is_refused():
    with pytest.raises(LlamaServerArgsError, match="both set"):
        lsa.build_argv({"mmap": False, "load_mode": "none"})


def test_enable_thinking_kwarg_becomes_reasoning_and_conflicts_are_refused():
    got = pairs(lsa.build_argv({"chat_template_kwargs": {"enable_thinking": False, "x": 1}}))
    assert got["--reasoning"] == "off"
    assert json.loads(got["--chat-template-kwargs"]) == {"x": 1}
    got = pairs(lsa.build_argv({"chat_template_kwargs": '{"enable_thinking": true}'}))
    assert got == {"--reasoning": "on"}
    with pytest.raises(LlamaServerArgsError, match="contradicts"):
        lsa.build_argv({"chat_template_kwargs": {"enable_thinking": True}, "reasoning": "off"})


def test_draft_cache_types_follow_main_unless_set():
    got = pairs(lsa.build_argv({"spec_type": "draft-mtp", "cache_type_k": "q8_0", "cache_type_v": "q4_0"}))
    assert got["--spec-draft-type-k"] == "q8_0" and got["--spec-draft-type-v"] == "q4_0"
    got = pairs(lsa.build_argv({"spec_type": "draft-mtp", "cache_type_k": "q8_0",
                                "spec_draft_cache_type_k": "f16"}))
    assert got["--spec-draft-type-k"] == "f16"
    got = pairs(lsa.build_argv({"spec_type": "ngram-mod", "cache_type_k": "q8_0"}))
    assert "--spec-draft-type-k" not in got


@pytest.mark.parametrize("settings,message", [
    ({"ctx": 4096}, "unknown llama-server setting 'ctx'"),
    ({"port": 1}, "instance field"),
    ({"cache_type_k": "q9_9"}, "must be one of"),
    ({"flash_attn": "maybe"}, "on, off, auto"),
    ({"kv_unified": "yes"}, "true or false"),
    ({"ctx_size": True}, "expected a number"),
    ({"split_mode": ""}, "empty"),
    ({"chat_template_kwargs": "{not json"}, "not valid JSON"),
])
def test_bad_settings_say_what_to_do(settings, message):
    with pytest.raises(LlamaServerArgsError, match=message):
        lsa.build_argv(settings)


@pytest.mark.parametrize("arg,message", [
    ("--api-key=abc", "secrets never go on a command line"),
    ("--api-key", "secrets never go on a command line"),
    ("--draft-max", "removed"),
    ("--draft", "removed"),
    ("--no-mmap", "legacy"),
    ("--draft-p-min", "legacy"),
    ("-c", "setting `ctx_size`"),
    ("--ctx-size=8", "setting `ctx_size`"),
])
def test_extra_args_refusals(arg, message):
    with pytest.raises(LlamaServerArgsError, match=message):
        lsa.build_argv({}, extra_args=[arg])


def test_extra_args_pass_through_last():
    argv = lsa.build_argv({"ctx_size": 8}, extra_args=["--no-warmup", "--cache-reuse", 256])
    assert argv[-3:] == ["--no-warmup", "--cache-reuse", "256"]


def test_main_gpu_is_physical_and_becomes_relative():
    # The seed: GPUs 2 and 3, "main GPU 0 = physical GPU 2".
    p = plan([{"name": "q", "model": "tiny", "gpus": [2, 3], "port": 8003, "settings": {"main_gpu": 2}}],
             gpus=GPUS)[0]
    assert p["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert pairs(p["argv"])["--main-gpu"] == "0"
    p = plan([{"name": "q", "model": "tiny", "gpus": [3, 1], "port": 8003, "settings": {"main_gpu": 1}}],
             gpus=GPUS)[0]
    assert p["env"]["CUDA_VISIBLE_DEVICES"] == "3,1"
    assert pairs(p["argv"])["--main-gpu"] == "1"
    uuid = GPUS["gpus"][2]["uuid"]
    p = plan([{"name": "q", "model": "tiny", "gpus": [GPUS["gpus"][3]["uuid"], uuid], "port": 8003,
               "settings": {"main_gpu": uuid.lower()}}], gpus=GPUS)[0]
    assert pairs(p["argv"])["--main-gpu"] == "1"
    assert p["env"]["CUDA_VISIBLE_DEVICES"].endswith(uuid)
    with pytest.raises(LlamaServerArgsError, match="main_gpu 0 is not one of this instance's GPUs"):
        plan([{"name": "q", "model": "tiny", "gpus": [2, 3], "port": 8003, "settings": {"main_gpu": 0}}])


def test_gpus_checked_against_llmops_gpus_and_never_shared():
    with pytest.raises(LlamaServerArgsError, match="GPU 7 does not exist"):
        plan([{"name": "q", "model": "tiny", "gpus": [7], "port": 8003}], gpus=GPUS)
    with pytest.raises(LlamaServerArgsError, match="GPU-deadbeef-0000 does not exist"):
        plan([{"name": "q", "model": "tiny", "gpus": ["GPU-deadbeef-0000"], "port": 8003}], gpus=GPUS)
    with pytest.raises(LlamaServerArgsError, match="no NVIDIA GPU"):
        plan([{"name": "q", "model": "tiny", "gpus": [0], "port": 8003}], gpus={"present": False})
    with pytest.raises(LlamaServerArgsError, match="given to both a and b"):
        plan([{"name": "a", "model": "tiny", "gpus": [0, 1], "port": 8001},
              {"name": "b", "model": "tiny", "gpus": [1], "port": 8002}], gpus=GPUS)
    with pytest.raises(LlamaServerArgsError, match="tensor_split has 3 entries"):
        plan([{"name": "q", "model": "tiny", "gpus": [0, 1], "port": 8003,
               "settings": {"tensor_split": [1, 1, 1]}}])


def test_open_bind_without_key_is_refused_with_instructions():
    inst = [{"name": "q", "model": "tiny", "host": "0.0.0.0", "port": 8003}]
    with pytest.raises(LlamaServerArgsError, match=r"binds 0\.0\.0\.0 without an API key.*"
                                                   r"llama_server_api_keys\['q'\]"):
        plan(inst)
    with pytest.raises(LlamaServerArgsError, match="without an API key"):
        plan([dict(inst[0], host="127.0.0.1,10.0.0.5")])
    p = plan(inst, api_key_names=["q"], key_dir="/etc/llama-server/")[0]
    assert p["key_file"] == "/etc/llama-server/q.key"
    assert pairs(p["argv"])["--api-key-file"] == "/etc/llama-server/q.key"
    assert p["url"] == "http://127.0.0.1:8003"
    # loopback needs no key, and gets no --api-key-file
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        p = plan([dict(inst[0], host=host)])[0]
        assert p["key_file"] is None and "--api-key-file" not in p["argv"]
    assert plan([dict(inst[0], host="::1")])[0]["url"] == "http://[::1]:8003"


@pytest.mark.parametrize("instances,message", [
    ([{"name": "a", "model": "tiny", "port": 1}, {"name": "a", "model": "tiny", "port": 2}], "used twice"),
    ([{"name": "a", "model": "tiny", "port": 1}, {"name": "b", "model": "tiny", "port": 1}],
     "both use port 1"),
    ([{"name": "a b", "model": "tiny", "port": 1}], "names the systemd unit"),
    ([{"name": "a", "model": "tiny", "port": 0}], "port must be a number"),
    ([{"name": "a", "model": "nope", "port": 1}], "neither a model of llmops_models"),
    ([{"name": "a", "model": "tiny", "port": 1, "ctx_size": 4}], "unknown field"),
    ([{"name": "a", "model": "tiny", "port": 1, "mode": "k8s"}], "host or container"),
    ([{"name": "a", "model": "tiny", "port": 1, "gpus": [0], "env": {"CUDA_VISIBLE_DEVICES": "1"}}],
     "comes from its gpus list"),
])
def test_bad_instances(instances, message):
    with pytest.raises(LlamaServerArgsError, match=message):
        plan(instances)


def test_missing_engine_is_refused():
    with pytest.raises(LlamaServerArgsError, match="run the llama_cpp role first"):
        plan([{"name": "a", "model": "tiny", "port": 1}], llama_cpp={})
    with pytest.raises(LlamaServerArgsError, match="needs an image"):
        plan([{"name": "a", "model": "tiny", "port": 1}], llama_cpp={"mode": "container"})
    p = plan([{"name": "a", "model": "tiny", "port": 1}], llama_cpp={}, binary_override="/usr/local/bin/ls")
    assert p[0]["binary"] == "/usr/local/bin/ls"


def test_container_mode_gets_only_its_gpus_readonly_mounts_and_relative_paths():
    p = plan([{"name": "q", "model": "tiny", "gpus": [2, 3], "host": "0.0.0.0", "port": 8003,
               "settings": {"mlock": True, "mmap": False}}],
             llama_cpp={"mode": "container", "image": "llmops/llama.cpp:b1", "build_id": "b1"},
             api_key_names=["q"])[0]
    assert "CUDA_VISIBLE_DEVICES" not in p["env"]
    args = lsa.docker_run_args(p, user="998:997", entrypoint="/app/llama-server")
    # what docker receives once systemd has unquoted the ExecStart line
    parsed = shlex.split(lsa.systemd_command(args))
    assert parsed[parsed.index("--gpus") + 1] == '"device=2,3"'
    assert "%s:/models:ro" % "/home/models/tiny" in parsed
    assert "/etc/llama-server/q.key:/run/secrets/llama-server-api-key:ro" in parsed
    assert parsed[parsed.index("--user") + 1] == "998:997"
    assert parsed[parsed.index("--ulimit") + 1] == "memlock=-1:-1"
    image_at = parsed.index("llmops/llama.cpp:b1")
    # instance env (maybe secrets) comes from its 0600 file, never as -e NAME=value
    assert parsed[parsed.index("--env-file") + 1] == "/etc/llama-server/q.env"
    assert "-e" not in parsed[:image_at]
    server = pairs(parsed[image_at + 1:])
    assert server["--model"] == "/models/tiny.gguf"
    assert server["--api-key-file"] == "/run/secrets/llama-server-api-key"


@pytest.mark.parametrize("arg", ['{"a": "b c"}', "50%", "$HOME", "back\\slash", "plain-1.0", 'say "hi"'])
def test_systemd_quote_roundtrip(arg):
    quoted = lsa.systemd_quote(arg)
    # systemd: %% -> %, $$ -> $ after unquoting (shlex posix follows the same quote/backslash rules)
    assert shlex.split(quoted)[0].replace("%%", "%").replace("$$", "$") == arg


def test_hardening_by_systemd_version():
    old = dict(lsa.hardening(219, read_paths=["/home/models/x.gguf"]))
    new = dict(lsa.hardening(252, read_paths=["/srv/models/x.gguf"]))
    assert old["ProtectSystem"] == "full" and old["ProtectHome"] == "read-only"
    for directive in ("ProtectKernelTunables", "ProtectControlGroups", "RestrictNamespaces", "ProtectClock",
                      "LockPersonality"):
        assert directive not in old
        assert directive in new
    assert new["ProtectSystem"] == "strict" and new["ProtectHome"] == "yes"
    assert dict(lsa.hardening(252, read_paths=["/home/models/x.gguf"]))["ProtectHome"] == "read-only"
    for version in (219, 252, 999):
        for mode in ("host", "container"):
            names = dict(lsa.hardening(version, mode=mode))
            assert "PrivateDevices" not in names and "DevicePolicy" not in names
            assert "MemoryDenyWriteExecute" not in names
    assert dict(lsa.hardening(252, mode="container")) == {"PrivateTmp": "yes"}


def test_restart_policy_spellings():
    old = lsa.restart_policy(219, restart_sec=10, interval=600, burst=5)
    assert ("StartLimitInterval", "600") in old["service"] and ("StartLimitBurst", "5") in old["service"]
    assert old["unit"] == []
    new = lsa.restart_policy(252)
    assert ("StartLimitIntervalSec", "600") in new["unit"]
    assert not any(k.startswith("StartLimit") for k, _ in new["service"])
    assert ("Restart", "on-failure") in new["service"]
    assert ("RestartMaxDelaySec", "300") in lsa.restart_policy(254)["service"]


def test_parse_systemd_version():
    assert lsa.parse_systemd_version("systemd 219\n+PAM +AUDIT") == 219
    assert lsa.parse_systemd_version("systemd 252 (252.38-1~deb12u1)\n") == 252
    assert lsa.parse_systemd_version("") == 0


def test_env_is_checked_and_only_its_names_are_in_the_plan():
    p = plan([{"name": "a", "model": "tiny", "port": 1, "env": {"HF_TOKEN": "hf_plan_secret_1", "N": 3}}])[0]
    assert p["env_names"] == ["HF_TOKEN", "N"] and p["env_file"] == "/etc/llama-server/a.env"
    assert "hf_plan_secret_1" not in repr(p)
    instances = [{"name": "a", "env": {"N": 3, "HF_TOKEN": 'x"y'}}]
    assert lsa.instance_env_file(instances, "a") == 'HF_TOKEN="x\\"y"\nN="3"\n'
    assert lsa.instance_env_file(instances, "a", mode="container") == 'HF_TOKEN=x"y\nN=3\n'
    assert lsa.instance_env_file([{"name": "a"}], "a") == ""
    with pytest.raises(LlamaServerArgsError, match="no instance named b"):
        lsa.instance_env_file([{"name": "a"}], "b")
