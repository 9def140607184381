#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_download
short_description: Download a model file from Hugging Face, ModelScope or a URL, resumable and verified
author:
  - llmops.serving developers (@llmops)
description:
  - Downloads one model file (or every part of a split GGUF set) into O(dest). The final path only ever
    holds a verified file; bytes land in C(<file>.part) first, are checked against size and sha256, then
    renamed atomically.
  - The expected sha256 and size come from O(sha256)/O(size), or from the hub. Hugging Face (and mirrors
    such as hf-mirror.com) - the HEAD answer (C(X-Linked-Etag), C(X-Linked-Size)); the revision is pinned
    to the commit it resolved to (C(X-Repo-Commit)) for the whole download and recorded.
  - ModelScope (O(source=modelscope)) - the repo's file listing
    C(<endpoint>/api/v1/models/<org>/<name>/repo/files?Revision=<rev>&Recursive=true) gives C(Sha256),
    C(Size) and the file's last commit C(Revision) (recorded as the commit); the bytes come from
    C(<endpoint>/models/<org>/<name>/resolve/<rev>/<file>). The listing is fetched once per run.
  - Resumes an interrupted download from C(<file>.part) and C(<file>.part.json) (Range and If-Range),
    fetches large files over several connections in parallel and computes the sha256 while the data
    arrives. Retries connection drops, stalls, HTTP 429/5xx (honouring Retry-After) with backoff.
  - A verified file has a sidecar record C(.<file>.llmops.json) (size, mtime, inode, ctime, sha256, commit,
    source); later runs trust it while size, mtime, inode and ctime are unchanged and, when the hub's HEAD
    gives a sha256, while the record agrees with it, so they do not re-hash.
  - The record belongs to the user the module runs as (root), whoever owns the model file, and is trusted
    only when owned by that user or root, with one link and writable by nobody else. The service user can
    write O(dest) but cannot create a root-owned file, so it cannot forge a record (nor the state of a
    partial download, which is checked the same way).
  - The fast path catches a rewrite, C(touch), a restored mtime, chmod and chown (they all change ctime,
    which cannot be set back). It cannot detect silent corruption below the filesystem (bit rot), nor
    changes by root or by someone who can write the block device. Use O(force_verify) for those, or pin the
    content with O(sha256).
  - Refuses, with a message naming the path, anything that is not a regular file at the paths it owns
    (the final path, C(<file>.part), C(<file>.part.json), the sidecar, the lock C(.<file>.llmops.lock)),
    that is a symlink, FIFO, socket, device or directory (and a hard link for files written in place). It
    never follows a link there nor blocks on a FIFO; temporary files get unguessable names in O(dest).
  - One run per destination file at a time (C(flock) on C(.<file>.llmops.lock), which holds the pid);
    another run on the same file (two plays, a retried job) waits up to O(lock_timeout) seconds and then
    finds the verified file.
  - Refuses content that is not what it claims - an HTML page (the mirror's login or error page) for a
    non-HTML file, a body whose length differs from the expected size - and never mixes two versions of
    a plain O(url) that has no validator (no ETag, no Last-Modified); it restarts from zero instead of
    resuming.
  - A checksum mismatch moves the bytes to C(<file>.corrupt-<UTC time>) and fails with expected vs got. There
    is at most one such copy per file - a new one replaces the older - so retried jobs cannot fill the disk.
  - The final path keeps its file until verified bytes replace it. A file there that does not match the
    source's sha256 stays in place while the download runs; once the new bytes are verified it moves to
    the quarantine slot and the message says so. A failed download leaves the final path as it was, and
    the message says what it holds.
  - A matching sha256 wins over a size claim. A source that claims nothing verifiable - size 0 and no sha256
    (a mirror's empty 200, a ModelScope listing entry of size 0), or a new version without sha256 and without
    ETag or Last-Modified - never replaces a file - the verified file is kept, with a warning. A file placed
    by hand that cannot be checked (no sha256 from the source, another size) is left untouched and the run
    fails saying so. A sidecar record that the hub contradicts (another sha256, even for the commit the
    record names) is not trusted - the file is hashed and kept only when it has the hub's sha256, else
    downloaded again; new bytes replace it only when they have the hub's sha256.
  - Every part of a Hugging Face split set comes from one commit, the RV(commit) reported - the one the first
    part resolved to (a branch that moves between two parts cannot mix commits), or, with O(update=false),
    the commit of the parts already verified (the rest of a half-fetched set is fetched at it); with
    O(update=true) the whole set moves, or stays whole when a part cannot move verifiably. On ModelScope,
    every part's sha256 and size come from one listing.
  - Every metadata request (a HEAD, the ModelScope listing) must end within 4 x O(timeout) in all, body
    included, so a server that sends one byte per second cannot hold the run (and its lock); it counts as a
    stall. The ModelScope listing may be at most 16 MiB and 1,000,000 JSON values; only the entries of the
    files asked for are kept while it is parsed. Error and redirect bodies are read up to 64 KiB.
  - When the hub's branch moved to a new commit since the recorded download, the verified file is kept
    (result RV(update_available)) unless O(update=true).
version_added: "0.1.0"
options:
  repo:
    description: Hub repository, C(org/name), for example C(unsloth/Qwen3.6-27B-MTP-GGUF); with O(filename).
    type: str
  filename:
    description:
      - File in O(repo), may include a folder. A split GGUF name such as C(model-00001-of-00003.gguf)
        fetches every part of the set. A name with an empty, C(.) or C(..) part (C(sub/), C(.)) names no file
        and is refused.
    type: str
  url:
    description:
      - A plain HTTP(S) URL instead of O(repo)/O(filename) (O(source), O(revision) and O(endpoint) are then
        not used). Give O(sha256) to have it verified.
      - Or a C(file:///absolute/path) of a file on the node (an offline bundle's model), with O(sha256)
        (required for a file); it is copied through the same verification as a download (size, sha256,
        quarantine, sidecar record), so bytes that do not match never reach the final path.
      - Its query string is masked (C(********)) in this module's result, C(invocation.module_args)
        included, which AWX stores. Ansible has written the module's arguments to the node's log (journal
        or syslog) before the module runs, so a query that carries a credential (a signed URL's
        C(X-Amz-Signature), a token parameter) belongs in O(url_query); a warning says so.
    type: str
  url_query:
    description:
      - The query string of O(url), without C(?), when it carries a credential, such as a signed URL's
        C(X-Amz-Credential=...&X-Amz-Signature=...) or a token parameter. Appended to O(url) for every
        request; never logged or shown (C(no_log)); the sidecar record and RV(source_url) keep the URL
        without it.
    type: str
  dest:
    description: Directory that receives the file(s); created when missing.
    type: path
    required: true
  sha256:
    description:
      - Expected sha256 (64 hex digits) of the single file; checked against the hub's value too.
      - Without it, a plain O(url) download is recorded with the sha256 computed while downloading (nothing
        to compare it against).
    type: str
  size:
    description: Expected size in bytes of the single file (0 to 2^63 - 1).
    type: int
  connections:
    description: Parallel connections (ranges) for files of at least O(parallel_min_size) bytes.
    type: int
    default: 8
attributes:
  check_mode:
    support: full
    details: Resolves the metadata (HEAD requests, or the ModelScope listing) and reports what would happen;
      downloads nothing.
  diff_mode:
    support: none
    details: Reports no diff; the files are binary.
extends_documentation_fragment:
  - ansible.builtin.files
  - llmops.serving.attributes
  - llmops.serving.download.transfer
  - llmops.serving.download
seealso:
  - name: Hugging Face hub download URLs
    description: The resolve endpoint this module speaks.
    link: https://huggingface.co/docs/hub/en/api
  - name: ModelScope Hub
    description: The hub O(source=modelscope) speaks to (access tokens under the user's account settings).
    link: https://www.modelscope.cn/docs
"""

EXAMPLES = r"""
- name: Download the Qwen3.6 27B GGUF through the mirror, 8 connections, verified
  llmops.serving.model_download:
    repo: unsloth/Qwen3.6-27B-MTP-GGUF
    filename: Qwen3.6-27B-UD-Q5_K_XL.gguf
    endpoint: https://hf-mirror.com
    dest: /home/models/qwen3-27b-mtp-gguf
    owner: llama
    group: llama
    mode: "0644"
    progress_file: /run/llmops/qwen.progress.json
  async: 21600
  poll: 0
  register: llmops_model_job

- name: Download a gated model with a token from Vault
  llmops.serving.model_download:
    repo: meta-llama/Llama-3.1-8B-Instruct-GGUF
    filename: model-00001-of-00002.gguf
    revision: 0123456789abcdef0123456789abcdef01234567
    token: "{{ vault_hf_token }}"
    dest: /srv/models/llama
  no_log: true

- name: Download a GGUF from ModelScope (default branch master), verified against its file listing
  llmops.serving.model_download:
    source: modelscope
    repo: unsloth/Qwen3.6-27B-MTP-GGUF
    filename: Qwen3.6-27B-UD-Q5_K_XL.gguf
    dest: /home/models/qwen3-27b-mtp-gguf

- name: Download from a plain URL with a known checksum
  llmops.serving.model_download:
    url: https://models.example.com/tiny.gguf
    sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    dest: /srv/models/tiny
"""

RETURN = r"""
path:
  description: Final path of the file (of the first part for a split set).
  returned: always
  type: str
  sample: /home/models/qwen3-27b-mtp-gguf/Qwen3.6-27B-UD-Q5_K_XL.gguf
paths:
  description: Final paths of all files (all parts of a split set, in order).
  returned: always
  type: list
  elements: str
size:
  description:
    - Size in bytes of RV(path). Ansible's file attributes (added for RV(path)) replace the module's
      value, so for a split set this is the first part's size; use RV(total_size) for the whole set.
  returned: always
  type: int
total_size:
  description: Total size in bytes of all files (the sum of the parts of a split set).
  returned: always
  type: int
  sample: 19541778432
sha256:
  description: sha256 of the file (of the first part for a split set; see RV(parts)).
  returned: always
  type: str
commit:
  description:
    - Hub commit the file comes from (null for a plain URL). For ModelScope, the commit that last changed
      the file (the listing's C(Revision)).
  returned: always
  type: str
source_url:
  description: Where the bytes come from, without credentials or query string.
  returned: always
  type: str
downloaded_bytes:
  description: Bytes received in this run.
  returned: always
  type: int
resumed_from:
  description: Bytes that were already in the partial download(s) when this run started.
  returned: always
  type: int
verified:
  description:
    - How the file was verified in this run, the weakest of all parts; C(sidecar) = record matched (no
      hashing), C(hashed) = existing file re-hashed, C(download) = hashed while downloading.
    - Null in check mode when the file would still have to be hashed or downloaded.
  returned: always
  type: str
  choices: [sidecar, hashed, download]
elapsed_s:
  description: Seconds this run took.
  returned: always
  type: float
update_available:
  description: The hub's revision now points to another commit than the verified file; see O(update).
  returned: always
  type: bool
parts:
  description: Per file, C(path), C(name), C(size), C(sha256), C(commit), C(verified), C(downloaded_bytes),
    C(resumed_from), C(changed); in check mode also C(action) (keep, recommit, force_verify, hash_existing
    or download) and C(reason), what a real run would do and why.
  returned: always
  type: list
  elements: dict
msg:
  description: What happened, in words.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download.fetch import run  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (  # noqa: E402
    hide_url_query,
    run_in_module,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.options import (  # noqa: E402
    OPTION_RULES,
    OPTIONS,
    argument_spec,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402


def main():
    run_module(AnsibleModule, "model_download", _run, argument_spec=argument_spec(),
               add_file_common_args=True, **OPTION_RULES)


def _run(module):
    hide_url_query(module)

    def set_attributes(path):
        # applied inside the run, under its lock, before the sidecar is final (chmod/chown move ctime)
        file_args = module.load_file_common_arguments(module.params, path=path)
        return module.set_fs_attributes_if_different(file_args, False)

    result = run_in_module(module, "model_download", run, OPTIONS, set_attributes)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
