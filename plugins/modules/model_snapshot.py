#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_snapshot
short_description: Fetch a Hugging Face or ModelScope repository snapshot (a vLLM model directory), verified
author:
  - llmops.serving developers (@llmops)
description:
  - Fetches the files of O(repo) at one commit into a model directory that vLLM reads as O(dest) (safetensors
    shards, C(config.json), tokenizer files). O(dest) is a relative symbolic link to
    C(<parent>/.<name>.snapshots/<id>/), switched atomically (C(rename(2)) of a new link) only after the new
    snapshot is complete and verified, so a failed, partial or killed update leaves the previous snapshot
    serving. The snapshot before the current one is kept, older ones are removed.
  - Hugging Face (and mirrors such as hf-mirror.com) - the revision resolves once to a commit
    (C(/api/models/<repo>/revision/<rev>)); the listing C(/api/models/<repo>/tree/<commit>?recursive=true)
    gives each file's size and checksum; every file is fetched from C(/resolve/<commit>/).
  - ModelScope (O(source=modelscope)) - the listing C(/api/v1/models/<repo>/repo/files) gives each file's
    C(Sha256). ModelScope cannot resolve a branch to a commit, so a branch is pinned by content (every byte
    checked against the one listing read at the start; a snapshot named C(ms-<digest>)); a 40-hex O(revision)
    pins the commit.
  - Every file is verified before it enters the snapshot - LFS files by the listing's sha256, plain git files
    by their git blob id (C(sha1("blob <size>\0" + bytes))), ModelScope files by their sha256, and all by
    size. A mismatch moves the bytes to C(<parent>/.<name>.snapshots/corrupt/) and fails the run.
  - Each file goes through model_download's machinery (C(<file>.part) and ranges in C(<file>.part.json),
    parallel ranges, streaming sha256, retries with backoff), so an interrupted run (drop, C(kill -9), async
    timeout) resumes every partial file and keeps every finished one. Files are fetched in parallel within one
    budget of O(connections) (a file of at least O(parallel_min_size) takes all of them, a smaller one takes
    one). A file whose checksum equals a verified file of a snapshot already on the node is hard-linked from
    it instead of fetched (an update fetches only what changed).
  - A manifest C(.llmops-snapshot.json) in the snapshot records the repo, the commit and per file its size,
    sha256, git blob id and stat identity (size, mtime, inode, ctime). A re-run trusts a file while its stat
    identity is unchanged (the sidecar rules of M(llmops.serving.model_download), with the same limits) and
    hashes the others; a damaged file makes the run build a repaired snapshot of the same commit and switch to
    it. A re-run with O(revision) pinned to the current commit makes no request.
  - Refuses a hostile listing before writing anything - a path with C(..), an absolute path, a backslash,
    control characters, a duplicate, a file that is also a folder, the manifest's name or C(<file>.part), a
    file without size or checksum, a listing over 8 MiB (all pages together, the read capped and the
    connection dropped, never read whole) or over 30,000 files.
  - Refuses, naming the path, anything in a snapshot that is not a listed file (a symlink, FIFO, device, or an
    extra file such as a planted C(*.safetensors) vLLM would load), O(dest) when it is a directory or link
    this module did not make, and a link or FIFO at any path it writes. One run per O(dest) at a time
    (C(flock) on C(<parent>/.<name>.llmops.lock)).
  - When the revision moved to a new commit since the current snapshot, it is kept (RV(update_available))
    unless O(update=true).
version_added: "0.5.0"
options:
  repo:
    description: Hub repository, C(org/name), for example C(Qwen/Qwen3.6-27B-FP8).
    type: str
    required: true
  dest:
    description:
      - The model directory vLLM is given, for example C(/home/models/Qwen3.6-27B-FP8) - an absolute path that
        this module makes a symbolic link to the current snapshot (its parent is created when missing).
    type: path
    required: true
  allow_patterns:
    description:
      - Only files whose repo path matches one of these shell globs (all files when empty). Matched against
        the whole path with fnmatch (C(*) also matches C(/)); a pattern ending in C(/) means everything under
        that folder, as huggingface_hub's C(allow_patterns).
      - Patterns that leave out a shard the checkpoint's C(model.safetensors.index.json) names are refused
        before the snapshot is published (the error names each missing shard and the pattern that excluded
        it).
    type: list
    elements: str
    default: []
  ignore_patterns:
    description: Leave out files whose repo path matches one of these shell globs (after O(allow_patterns)).
    type: list
    elements: str
    default: []
  connections:
    description: Parallel connections for the whole snapshot (at most 64).
    type: int
    default: 8
attributes:
  check_mode:
    support: full
    details: Resolves the commit and reads the listing (or the manifest) and reports what would happen per
      file (RV(actions)); writes nothing.
  diff_mode:
    support: full
    details: The snapshot before and after, one line per file (path, size, checksum).
extends_documentation_fragment:
  - ansible.builtin.files
  - llmops.serving.attributes
  - llmops.serving.download.transfer
  - llmops.serving.download
notes:
  - O(owner), O(group), O(mode) and the SELinux options apply to every file of the snapshot; its folders get
    O(owner) and O(group) and mode C(0755).
seealso:
  - module: llmops.serving.model_download
  - module: llmops.serving.safetensors_info
  - name: Hugging Face Hub API
    description: The revision and tree endpoints this module reads.
    link: https://huggingface.co/docs/hub/en/api
"""

EXAMPLES = r"""
- name: Fetch the FP8 checkpoint for vLLM through the mirror, verified, as an async job
  llmops.serving.model_snapshot:
    repo: Qwen/Qwen3.6-27B-FP8
    endpoint: https://hf-mirror.com
    dest: /home/models/Qwen3.6-27B-FP8
    ignore_patterns: ["*.md", "original/"]
    progress_file: /run/llmops/qwen-fp8.progress.json
  async: 21600
  poll: 0
  register: llmops_snapshot_job

- name: Pin a commit (a re-run at that commit makes no request)
  llmops.serving.model_snapshot:
    repo: Qwen/Qwen3.6-27B-FP8
    revision: 0123456789abcdef0123456789abcdef01234567
    dest: /home/models/Qwen3.6-27B-FP8
"""

RETURN = r"""
path:
  description: O(dest), the path vLLM is given (a symbolic link to RV(snapshot_dir)).
  returned: always
  type: str
  sample: /home/models/Qwen3.6-27B-FP8
snapshot_dir:
  description: The snapshot O(dest) points at (null in check mode before the first snapshot).
  returned: always
  type: str
  sample: /home/models/.Qwen3.6-27B-FP8.snapshots/0123456789abcdef0123456789abcdef01234567
manifest:
  description: The snapshot's manifest file.
  returned: always
  type: str
repo:
  description: O(repo).
  returned: always
  type: str
source:
  description: O(source).
  returned: always
  type: str
revision:
  description: The revision asked for.
  returned: always
  type: str
commit:
  description: The commit of the snapshot (null for a ModelScope branch, pinned by content; see RV(id)).
  returned: always
  type: str
id:
  description: The snapshot's name - the commit, or C(ms-<digest>) for a ModelScope branch.
  returned: always
  type: str
sha256:
  description:
    - sha256 over the sorted C(path size sha256 git_sha1) lines of the manifest - the same files give the same
      value on every node (what llmops_models records as the model's sha256).
  returned: always
  type: str
total_size:
  description: Bytes of all files of the snapshot.
  returned: always
  type: int
file_count:
  description: Files in the snapshot.
  returned: always
  type: int
downloaded_bytes:
  description: Bytes received in this run.
  returned: always
  type: int
resumed_from:
  description: Bytes that partial downloads of an earlier run already held.
  returned: always
  type: int
reused_bytes:
  description: Bytes hard-linked from snapshots already on the node instead of fetched.
  returned: always
  type: int
fetched:
  description: Repo paths downloaded in this run.
  returned: always
  type: list
  elements: str
verified:
  description:
    - C(manifest) - every file vouched for by the manifest's stat identity (nothing hashed); C(hashed) - some
      hashed on the node; C(download) - some downloaded and hashed while they arrived. Null in check mode when
      files would be hashed or fetched.
  returned: always
  type: str
  choices: [manifest, hashed, download]
update_available:
  description: The revision now points to another commit than the current snapshot; see O(update).
  returned: always
  type: bool
previous:
  description: The snapshot this run replaced (kept, unless it was damaged), or null.
  returned: always
  type: str
actions:
  description: Check mode only - per file of a new snapshot, C(path), C(action) (built, hash_built, link or
    download) and C(reason).
  returned: check mode
  type: list
  elements: dict
elapsed_s:
  description: Seconds this run took.
  returned: always
  type: float
msg:
  description: What happened, in words.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (  # noqa: E402
    run_in_module,
)
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.fetch import run  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.options import (  # noqa: E402
    OPTIONS,
    argument_spec,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402


def main():
    run_module(AnsibleModule, "model_snapshot", _run, argument_spec=argument_spec(),
               add_file_common_args=True)


def _run(module):
    def set_attributes(path, is_dir):
        # inside the run, under its lock, before the manifest is written (chmod/chown move ctime)
        file_args = module.load_file_common_arguments(module.params, path=path)
        if is_dir:
            file_args["mode"] = "0755"
        return module.set_fs_attributes_if_different(file_args, False)

    result = run_in_module(module, "model_snapshot", run, OPTIONS, set_attributes)
    diff = result.pop("diff")
    if module._diff and result["changed"]:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
