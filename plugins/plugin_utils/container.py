# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""`docker run` of a container-mode instance, for every engine: only its GPUs, its model directory and key
file read-only, its environment from its file. Tested by tests/unit/plugins/plugin_utils/test_systemd.py and
tests/roles/test_serving_env_secrets.py.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

# Where the instance's model directory and key file appear inside the container (the argv names these).
CONTAINER_MODEL_DIR = "/models"
CONTAINER_KEY_FILE = "/run/secrets/llama-server-api-key"


def memlock_ulimit(limit):
    """docker's `--ulimit memlock=` value of a locked-memory limit in systemd's LimitMEMLOCK spelling:
    infinity (or none) -> -1:-1 (unlimited), a number of bytes -> that number, soft and hard."""
    text = str(limit if limit is not None else "infinity").strip()
    if text in ("infinity", "unlimited", ""):
        return "memlock=-1:-1"
    if not text.isdigit():
        raise ValueError("locked-memory limit %r is neither infinity nor a number of bytes" % (limit,))
    return "memlock=%s:%s" % (text, text)


def docker_run_args(plan, user=None, docker="/usr/bin/docker", entrypoint=None, home=None, memlock=None):
    """argv of `docker run` for a container-mode instance (only its GPUs; model dir and key read-only; env
    from its file).

    `entrypoint`: the engine's path inside the image; default the plan's (the build fact's binary of a
    container build), else the image's own ENTRYPOINT (upstream llama.cpp server images; vllm-openai's is
    `vllm serve`). An engine with a subcommand (vLLM: serve) gets it after the image only with an explicit
    entrypoint.

    `home`: with `user`, the service user's home on the node, mounted read-write at the same path and set as
    HOME: the image's own HOME (/root in vllm-openai) is not writable by that user, and vLLM keeps its
    compile and CUDA-graph caches under ~/.cache (kept across restarts, so a restart starts faster).

    `memlock`: the locked-memory limit the node can grant (role serving's LimitMEMLOCK: infinity, or the hard
    limit of a node that cannot raise it, itself a container say); the container of an instance with mlock
    gets it, as its unit would.
    """
    entrypoint = entrypoint or plan.get("container_entrypoint")
    args = [docker, "run", "--rm", "--name", plan["container_name"], "--network", "host", "--init"]
    if plan["gpus"]:
        # docker parses --gpus as CSV: the quotes keep "device=2,3" one field.
        args += ["--gpus", '"device=%s"' % ",".join(str(g) for g in plan["gpus"])]
    if user:
        args += ["--user", str(user)]
        if home:
            args += ["-v", "%s:%s" % (home, home), "-e", "HOME=%s" % home]
    if plan["mlock"]:
        args += ["--ulimit", memlock_ulimit(memlock)]
    args += ["-v", "%s:%s:ro" % (plan["model_dir"], CONTAINER_MODEL_DIR)]
    if plan["key_file"]:
        args += ["-v", "%s:%s:ro" % (plan["key_file"], CONTAINER_KEY_FILE)]
    # The instance's env: read from its 0600 file by the docker client (root), never on this command line.
    if plan.get("env_file"):
        args += ["--env-file", plan["env_file"]]
    for key, value in plan["env"].items():      # only what the role computes (nothing secret)
        args += ["-e", "%s=%s" % (key, value)]
    args += list(plan.get("container_args") or ())
    if entrypoint:
        args += ["--entrypoint", entrypoint]
    args.append(plan["image"])
    subcommand = list(plan.get("subcommand") or ()) if entrypoint else []
    return args + subcommand + list(plan["argv"])
