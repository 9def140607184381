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


def docker_run_args(plan, user=None, docker="/usr/bin/docker", entrypoint=None, home=None):
    """argv of `docker run` for a container-mode instance (only its GPUs; model dir and key read-only; env
    from its file).

    `entrypoint`: the engine's path inside the image; default the plan's (the build fact's binary of a
    container build), else the image's own ENTRYPOINT (upstream llama.cpp server images; vllm-openai's is
    `vllm serve`). An engine with a subcommand (vLLM: serve) gets it after the image only with an explicit
    entrypoint.

    `home`: with `user`, the service user's home on the node, mounted read-write at the same path and set as
    HOME: the image's own HOME (/root in vllm-openai) is not writable by that user, and vLLM keeps its
    compile and CUDA-graph caches under ~/.cache (kept across restarts, so a restart starts faster).
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
        args += ["--ulimit", "memlock=-1:-1"]
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
