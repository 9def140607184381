#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gguf_info
short_description: Check a GGUF model file's structure and describe the model
author:
  - llmops.serving developers (@llmops)
description:
  - Reads only the header, the key/value metadata and the tensor table of a GGUF file (never the tensor
    data, so it takes milliseconds even for a 20 GB model) and checks its structure like llama.cpp does
    magic, version 2 or 3, counts, string and array lengths within O(limits), value and tensor types,
    dimensions, tensor offsets aligned to C(general.alignment), in order, without overlap or gap, and a data
    section that ends exactly at the end of the file, so a truncated download is caught without hashing.
  - A malformed or crafted file fails the task with a message that says what is wrong and at which byte
    offset; it never crashes, hangs or allocates much memory. Every count the file states is bounded before
    it is used, by O(limits) and by what the rest of the file can hold (each key/value, tensor or array
    element takes at least one byte), so a count of 2^63 in a 700-byte file fails in milliseconds. The whole
    header shares one budget (O(limits.max_metadata_bytes)) for its size in the file and the memory its kept
    values take, and one for its number of strings (O(limits.max_metadata_strings)), which bounds the time
    spent walking token and merge lists. The block count, which sizes every per-layer result, is bounded by
    O(limits.max_block_count) and, in a file with tensors, by the tensor count.
  - Strings are taken as bytes, like llama.cpp does (no UTF-8 validation), so keys and tensor names that
    differ only in bytes that are not UTF-8 are different, and the 63-byte tensor name limit counts bytes.
    Returned text has such bytes replaced by U+FFFD (in RV(kv) keys, by C(\xNN) escapes, so keys stay
    distinct).
  - Returns the architecture, quantization, hyperparameters, the hybrid layout (which blocks are attention,
    recurrent or MTP/nextn), the tokenizer, the chat template with its risky constructs, split information,
    and tensor sizes per layer.
  - Optionally verifies the whole file's sha256 against O(sha256). When the sidecar record
    C(<dir>/.<file>.llmops.json) that M(llmops.serving.model_download) writes for a file it verified still
    matches the file's size, mtime, inode and ctime, its digest is used and nothing is hashed, so checking a
    downloaded 20 GB model takes milliseconds on every run.
  - Read-only, like every C(_info) module - it never writes the sidecar record or anything else. A file
    that model_download did not verify (no matching record) is hashed on each run that asks for its
    sha256; let model_download verify it once (a file already in O(path) with the expected size is hashed
    and recorded by it) to make later runs fast.
  - For the first part of a split set (C(NAME-00001-of-00003.gguf)), checks that every part exists, parses
    and agrees on C(split.count) and C(split.tensors.count), and returns the tensor figures of the whole
    set (each part's own in RV(split_set)).
  - Plans before downloading - with O(url), or O(repo) and O(filename), reads the header of a GGUF that is
    not downloaded yet from the hub or mirror with HTTP Range requests (windows of 1 MiB, doubling as the
    parser needs more; the tensor data is never requested) and returns the same facts as for a local file,
    plus RV(remote). The file size, which the structure check needs, comes from C(Content-Range). The
    source options mean what they mean for M(llmops.serving.model_download), token rules included. A server
    that ignores Range is refused after the first window; for a split set every part's header is read,
    at the commit the first part resolved to (Hugging Face).
version_added: "0.1.0"
options:
  path:
    description:
      - The GGUF file (for a split set, any part; the first part is usual).
      - Exactly one of O(path), O(url) and O(repo) is required.
    type: path
  url:
    description:
      - A plain HTTP(S) URL of a GGUF file whose header is read remotely, instead of O(path); or a
        C(file:///absolute/path) on the node (an offline bundle's model), read the same way.
      - Its query string is masked in the result, as for model_download; a query that carries a credential
        (a signed URL) belongs in O(url_query).
    type: str
  url_query:
    description:
      - The query string of O(url), without C(?), when it carries a credential (a signed URL's signature, a
        token parameter), as for model_download. Appended to O(url); never logged or shown (C(no_log)).
    type: str
  repo:
    description:
      - Hub repository, C(org/name), whose O(filename) header is read remotely, instead of O(path).
    type: str
  filename:
    description: File in O(repo), may include a folder; for a split set, any part's name.
    type: str
  sha256:
    description:
      - Expected sha256 of the file (64 hex digits, optionally prefixed C(sha256:)). The task fails on a
        mismatch. Uses the digest of a matching sidecar record unless O(force_verify).
      - Local files only, like O(compute_sha256) and O(force_verify); for a remote file, C(sha256) in
        RV(remote) is the digest the hub states.
    type: str
  compute_sha256:
    description: Return the file's sha256 (read from the record like O(sha256)) even when none is expected.
    type: bool
    default: false
  force_verify:
    description: Hash the file even when the sidecar record matches (the record is not changed).
    type: bool
    default: false
  check_split:
    description:
      - For a part of a split set, check that all parts exist and are consistent, and make the tensor
        figures (RV(layer_bytes), RV(non_layer_tensors), RV(tensor_bytes)...) cover the whole set.
      - When false, those figures are the named file's alone (a fraction of the model).
    type: bool
    default: true
  include_kv:
    description: Also return all key/values in RV(kv); long arrays (tokens, merges) are summarized.
    type: bool
    default: false
  limits:
    description: Hard limits for the structure check. Files over a limit fail.
    type: dict
    default: {}
    suboptions:
      max_tensors:
        description: Most tensors a file may declare; also bounds the whole of a split set.
        type: int
        default: 65536
      max_kv:
        description: Most key/value pairs a file may declare.
        type: int
        default: 65536
      max_string_bytes:
        description: Longest string (key, value, tensor name) in bytes.
        type: int
        default: 16777216
      max_array_elements:
        description: Most elements of one metadata array.
        type: int
        default: 16777216
      max_dims:
        description: Most dimensions of one tensor.
        type: int
        default: 4
      max_block_count:
        description:
          - Most blocks (C(<arch>.block_count)) a file may declare; llama.cpp loads at most 512.
        type: int
        default: 4096
      max_metadata_bytes:
        description:
          - Most bytes the header (key/values and tensor table) may take, both in the file and in memory once
            parsed (kept values at the size of their Python objects). The largest real tokenizer metadata
            (gemma-4's vocabulary) is about 16 MB.
        type: int
        default: 67108864
      max_metadata_strings:
        description:
          - Most strings (keys, values, tensor names, array elements) in the header; bounds the time spent
            walking them. The largest real vocabulary files hold under 800000.
        type: int
        default: 2097152
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.download
notes:
  - A remote read costs about log2(header size) requests and at most twice the header plus 1 MiB (a
    15 MB tokenizer header about 31 MiB); C(bytes_read) and C(requests) in RV(remote) report it.
seealso:
  - module: llmops.serving.model_download
"""

EXAMPLES = r"""
- name: Check the downloaded model and learn its layout
  llmops.serving.gguf_info:
    path: /home/models/qwen3-27b-mtp-gguf/Qwen3.6-27B-UD-Q5_K_XL.gguf
  register: model_info

- name: The model has an MTP head for speculative decoding
  ansible.builtin.assert:
    that:
      - model_info.nextn_predict_layers >= 1
      - model_info.chat_template_risks | length == 0

- name: Plan before downloading - read the header from the hub with HTTP Range requests
  llmops.serving.gguf_info:
    repo: unsloth/Qwen3.6-27B-MTP-GGUF
    filename: Qwen3.6-27B-UD-Q5_K_XL.gguf
    token: "{{ vault_hf_token | default(omit) }}"
  register: remote_model_info

- name: Verify the full checksum too (from model_download's sidecar record when it matches, else hashed)
  llmops.serving.gguf_info:
    path: /home/models/qwen3-27b-mtp-gguf/Qwen3.6-27B-UD-Q5_K_XL.gguf
    sha256: "{{ expected_sha256 }}"
"""

RETURN = r"""
path:
  description: The file checked.
  returned: always
  type: str
gguf_version:
  description: GGUF format version (2 or 3).
  returned: always
  type: int
architecture:
  description: C(general.architecture), e.g. C(qwen35), C(llama).
  returned: always
  type: str
  sample: qwen35
name:
  description: C(general.name).
  returned: always
  type: str
file_type:
  description: Quantization from C(general.file_type) as llama.cpp names it; null when absent.
  returned: always
  type: str
  sample: MOSTLY_Q5_K_M
file_type_id:
  description: The raw C(general.file_type) number.
  returned: always
  type: int
block_count:
  description: Number of blocks, MTP/nextn blocks included (C(<arch>.block_count)).
  returned: always
  type: int
context_length:
  description: Training context length.
  returned: always
  type: int
embedding_length:
  description: Hidden size.
  returned: always
  type: int
feed_forward_length:
  description: FFN size (an int, or a list per block).
  returned: always
  type: raw
head_count:
  description: Attention heads (an int, or a list per block).
  returned: always
  type: raw
head_count_kv:
  description: KV heads (an int, or a list per block; 0 marks a recurrent block in some hybrids).
  returned: always
  type: raw
key_length:
  description: Attention key head size when the file sets it.
  returned: always
  type: int
value_length:
  description: Attention value head size when the file sets it.
  returned: always
  type: int
expert_count:
  description: Number of experts of a MoE model.
  returned: always
  type: int
nextn_predict_layers:
  description: Number of MTP/nextn blocks (stored after the trunk blocks); 0 when none.
  returned: always
  type: int
  sample: 1
layer_types:
  description: Kind of each block, C(attention), C(recurrent) or C(nextn).
  returned: always
  type: list
  elements: str
  sample: [recurrent, recurrent, recurrent, attention, nextn]
layer_types_source:
  description: The key the layout was derived from.
  returned: always
  type: str
  sample: qwen35.full_attention_interval
attention_layers:
  description: Indexes of attention blocks.
  returned: always
  type: list
  elements: int
recurrent_layers:
  description: Indexes of recurrent (GatedDeltaNet, Mamba...) blocks.
  returned: always
  type: list
  elements: int
nextn_layers:
  description: Indexes of MTP/nextn blocks.
  returned: always
  type: list
  elements: int
hybrid:
  description: Whether the model mixes attention and recurrent blocks.
  returned: always
  type: bool
full_attention_interval:
  description: C(<arch>.full_attention_interval) when set.
  returned: always
  type: int
ssm:
  description: The C(<arch>.ssm.*) keys without the prefix (conv_kernel, state_size, group_count...).
  returned: always
  type: dict
tokenizer_model:
  description: C(tokenizer.ggml.model), e.g. C(gpt2), C(llama).
  returned: always
  type: str
tokenizer_pre:
  description: C(tokenizer.ggml.pre), the pre-tokenizer.
  returned: always
  type: str
vocab_size:
  description: Number of tokens.
  returned: always
  type: int
chat_template:
  description: C(tokenizer.chat_template), null when absent.
  returned: always
  type: str
chat_template_risks:
  description:
    - Risky constructs found in the chat template, e.g. C(__globals__), C(__class__), C(__subclasses__),
      C(__builtins__), C(__import__), C(import), C(os.), C(popen), C(subprocess). Empty when none.
  returned: always
  type: list
  elements: str
split:
  description: C(split.no), C(split.count), C(split.tensors.count) as C(no), C(count), C(tensors_count); null
    when the file is not part of a split set.
  returned: always
  type: dict
split_set:
  description:
    - For a split set with O(check_split), C(count) (parts), C(tensor_count), C(size) (bytes of all parts) and
      C(tensor_bytes) of the whole set, and C(parts), one entry per part in order with its C(path) (a URL
      for a remote source), its file C(size) and its own C(tensor_count), C(tensor_bytes), C(tensor_types),
      C(layer_bytes), C(non_layer_bytes) and C(non_layer_tensors).
    - The named file's own figures are C(parts[split.no]); the top-level figures cover the whole set.
  returned: when the file is part of a split set and O(check_split) is true
  type: dict
  sample: {"count": 2, "tensor_count": 851, "size": 19465310208, "tensor_bytes": 19459000000,
           "parts": [{"path": "/m/Q5-00001-of-00002.gguf", "size": 9732655104, "tensor_count": 425,
                      "tensor_bytes": 9726000000, "tensor_types": {}, "layer_bytes": [],
                      "non_layer_bytes": 1055129600, "non_layer_tensors": {}}]}
tensor_count:
  description:
    - Number of tensors of the model - of the whole set for a split set with O(check_split), else of this file
      (the same holds for every tensor figure below).
  returned: always
  type: int
tensor_bytes:
  description: Sum of the tensor sizes in bytes (the whole split set with O(check_split)).
  returned: always
  type: int
tensor_types:
  description: Per ggml type, the count and bytes of tensors (the whole split set with O(check_split)).
  returned: always
  type: dict
  sample: {"Q5_K": {"count": 400, "bytes": 17000000000}}
layer_bytes:
  description:
    - Bytes of the tensors of each block C(blk.N), in block order.
    - For a split set with O(check_split), summed over all parts (a block may span two parts); the memory
      planner reads these, so they must cover the whole model.
  returned: always
  type: list
  elements: int
non_layer_bytes:
  description: Bytes of tensors outside the blocks (embeddings, output head); the whole split set with
    O(check_split).
  returned: always
  type: int
non_layer_tensors:
  description:
    - Bytes of each tensor outside the blocks, by tensor name (over all parts of a split set with
      O(check_split)).
    - The memory planner places them apart (llama.cpp keeps C(token_embd) in host memory, the output head with
      the last layer).
  returned: always
  type: dict
  sample: {"token_embd.weight": 1055129600, "output.weight": 1055129600, "output_norm.weight": 20480}
identity:
  description:
    - The stat identity of the file that was read - size, mtime_ns, ctime_ns, inode (for a split set, of
      the named part). Writing, touching, chmod/chown or replacing the file changes it (ctime cannot be set
      back short of stepping the clock), so role model reuses the header of a single-file model on a later
      run only while M(llmops.serving.node_state_info) reads the same identity.
    - Left out when the file changed while it was read or less than a second before (it could change again
      within the same timestamp granule without its identity changing).
  returned: when O(path) is set and the file had not changed in the second before it was read
  type: dict
  sample: {"size": 19465310208, "mtime_ns": 1764633600000000000, "ctime_ns": 1764633600000000000,
           "inode": 1310745}
summary_version:
  description:
    - The version of what this reader makes of a header (the summary, the chat-template scan, the layer
      layout). Role model reuses a header recorded by a past run only when it carries the same version.
  returned: always
  type: int
  sample: 1
kv_count:
  description: Number of key/value pairs.
  returned: always
  type: int
alignment:
  description: Data alignment in bytes.
  returned: always
  type: int
data_offset:
  description: Byte offset where tensor data starts.
  returned: always
  type: int
size:
  description: File size in bytes (this file; a split set's total is C(size) in RV(split_set)).
  returned: always
  type: int
kv:
  description: All key/values; arrays longer than 64 elements as C(type), C(element_type), C(count), C(head).
  returned: when O(include_kv) is true
  type: dict
sha256:
  description: The file's sha256.
  returned: when O(sha256) is set or O(compute_sha256) is true
  type: str
sha256_cached:
  description: Whether the digest came from model_download's sidecar record (no hashing was done).
  returned: when O(sha256) is set or O(compute_sha256) is true
  type: bool
verified:
  description: Whether the file matched O(sha256).
  returned: always
  type: bool
remote:
  description:
    - For a remote source, how it was read. C(url) is the file's URL without query string or user info;
      C(bytes_read) and C(requests) count the body bytes and the HTTP requests of the whole run (every part
      of a split set, a redirect followed counting once); C(size) is the file's size; C(sha256) and
      C(commit) are what the hub stated (null for a plain URL).
  returned: when O(url) or O(repo) is set
  type: dict
  sample: {"url": "https://huggingface.co/org/m/resolve/main/m.gguf", "bytes_read": 7340032, "requests": 4,
           "size": 19465310208, "sha256": null, "commit": null}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download import messages as download_messages  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download import options as download_options  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download import sidecar as model_sidecar  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._model_format import (  # noqa: E402
    gguf,
    gguf_remote,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = download_options.header_read_argument_spec(
    ("url", "url_query", "repo", "filename"),
    path=dict(type="path"),
    sha256=dict(type="str"),
    compute_sha256=dict(type="bool", default=False),
    force_verify=dict(type="bool", default=False),
    check_split=dict(type="bool", default=True),
    include_kv=dict(type="bool", default=False),
    limits=dict(type="dict", default={}, options=dict(
        (name, dict(type="int", default=value)) for name, value in gguf.DEFAULT_LIMITS.items())),
)


def main():
    run_module(AnsibleModule, "gguf_info", _run, argument_spec=ARGUMENT_SPEC,
               mutually_exclusive=[("path", "url", "repo")], required_one_of=[("path", "url", "repo")],
               required_together=[("repo", "filename")], required_by={"url_query": ("url",)})


def _run(module):
    download_messages.hide_url_query(module)
    p = module.params
    if gguf_remote.is_remote(p):
        main_remote(module)
    path = p["path"]
    expected = None
    if p["sha256"]:
        try:
            expected = gguf.normalize_digest(p["sha256"])
        except ValueError as exc:
            module.fail_json(msg=str(exc))
    try:
        structure = gguf.read_structure(path, p["limits"])
        result = gguf.summarize(structure, include_kv=p["include_kv"])
        if p["check_split"] and result["split"]:
            gguf.add_split_set(result, structure, p["limits"])
    except gguf.GGUFError as exc:
        module.fail_json(msg="GGUF check failed: %s" % exc, path=path, offset=exc.offset, verified=False)
    except ValueError as exc:
        module.fail_json(msg=str(exc), path=path, verified=False)
    except (MemoryError, OverflowError, RecursionError) as exc:  # a backstop: the limits should prevent these
        module.fail_json(msg="GGUF check failed: %s: %s while reading the metadata (crafted file?)"
                             % (path, type(exc).__name__), path=path, verified=False)

    result["verified"] = False
    if expected or p["compute_sha256"]:
        try:
            digest, cached = model_sidecar.sha256_cached(path, force=p["force_verify"])
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot hash %s: %s" % (path, exc), path=path, verified=False)
        result["sha256"] = digest
        result["sha256_cached"] = cached
        if expected and digest != expected:
            module.fail_json(
                msg="sha256 mismatch for %s: expected %s, got %s (corrupted or different file: download it "
                    "again)" % (path, expected, digest), **result)
        result["verified"] = bool(expected)
    module.exit_json(changed=False, **result)


def main_remote(module):
    """gguf_info on a remote GGUF (url or repo): its header read with HTTP Range requests."""
    p = module.params
    token = p["token"]
    local_only = [name for name in ("sha256", "compute_sha256", "force_verify") if p[name]]
    if local_only:
        module.fail_json(msg="%s check a local file's bytes, not a remote header: download the model first "
                             "(model_download verifies it) and give path" % ", ".join(local_only))
    try:
        result = gguf_remote.inspect_remote(p, p["limits"], include_kv=p["include_kv"],
                                            check_split=p["check_split"])
    except gguf.GGUFError as exc:
        module.fail_json(msg="GGUF check failed: %s" % exc, path=exc.path, offset=exc.offset, verified=False)
    except (download_messages.DownloadError, ValueError) as exc:
        module.fail_json(msg=download_messages.scrub(str(exc), token), verified=False)
    except Exception as exc:  # unexpected: still one clear line, never the token
        msg = "gguf_info failed: %s: %s" % (type(exc).__name__, exc)
        module.fail_json(msg=download_messages.scrub(msg, token), verified=False)
    result["verified"] = False
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
