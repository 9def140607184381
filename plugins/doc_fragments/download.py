# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The options of the modules that read a hub, documented once: their argument specs come from
    plugins/module_utils/_download/options.py (OPTIONS, HUB_OPTIONS, header_read_argument_spec) and mean the
    same in each, as they all go through download_options.normalize() and download_http on the node.

    DOCUMENTATION (``llmops.serving.download``): the hub a module reads, how its requests are retried and
    where it runs - model_download, model_snapshot, gguf_info and safetensors_info; the timeout and retries
    are a header read's (gguf_info, safetensors_info: a few MB before anything is downloaded).
    TRANSFER (``llmops.serving.download.transfer``): how files are fetched, resumed and verified -
    model_download and model_snapshot (a snapshot's files go through model_download's machinery,
    snapshot_options.SHARED), listed before DOCUMENTATION so that a transfer's timeout and retries win."""

    DOCUMENTATION = r"""
options:
  source:
    description:
      - The hub O(repo) lives on, which decides the API and URL layout, where sizes and checksums come from,
        the default O(endpoint) and O(revision), and the environment variables read for them.
      - V(huggingface) - Hugging Face or a mirror of it (such as hf-mirror.com); V(modelscope) - ModelScope
        (modelscope.cn) or a mirror of it.
    type: str
    default: huggingface
    choices: [huggingface, modelscope]
  revision:
    description:
      - Branch, tag or 40-hex commit id in O(repo). When not set, C(main) (Hugging Face) or C(master)
        (ModelScope).
    type: str
  endpoint:
    description:
      - Hub base URL, for example C(https://hf-mirror.com). When not set, the environment variable
        C(HF_ENDPOINT) on the node is used, else C(https://huggingface.co). For O(source=modelscope) it is
        C(MODELSCOPE_DOMAIN) (a host name or URL), else C(https://www.modelscope.cn).
    type: str
  token:
    description:
      - Hub access token for gated or private repos, sent as C(Authorization) only to the exact origin
        (scheme, host and port) of O(endpoint) (for a plain URL, of that URL), on every redirect hop; never
        to the CDN it redirects to, another port, or plain http after https. When not set, C(HF_TOKEN)
        from the node's environment is used.
      - For O(source=modelscope) the token (a ModelScope SDK access token) also goes as the cookie
        C(m_session_id), as the ModelScope SDK sends it, under the same origin rule; when not set,
        C(MODELSCOPE_API_TOKEN) from the node's environment is used (never C(HF_TOKEN)).
      - A token with whitespace or control characters (for example the trailing newline of a vault
        file) is refused before any request, without showing it; strip it with C(trim). Messages and
        results never contain the token, raw, escaped or URL-encoded.
    type: str
  validate_certs:
    description: Verify TLS certificates.
    type: bool
    default: true
  timeout:
    description:
      - Seconds without data (connect or read) before a remote request counts as stalled (1 to 86400).
      - Each remote request (a HEAD, a listing, each header window) must also end within 4 x O(timeout) in
        all, body included.
    type: int
    default: 30
  retries:
    description: Retries of a remote request after a dropped connection, a stall or HTTP 429/5xx (0 to 1000).
    type: int
    default: 2
attributes:
  platform:
    details: Any POSIX node with Python 3.6 or later.
notes:
  - Runs on the managed node with Python 3.6 or later and the standard library only.
  - Proxies come from the node's C(https_proxy)/C(http_proxy)/C(no_proxy) environment.
"""

    TRANSFER = r"""
options:
  parallel_min_size:
    description: Files of at least this many bytes are fetched over several connections (parallel ranges);
      smaller ones over one.
    type: int
    default: 67108864
  update:
    description: When the revision now points to another commit than the one on the node (the recorded
      download, the current snapshot), fetch it.
    type: bool
    default: false
  force_verify:
    description: Re-hash the files on the node even when their record (sidecar or snapshot manifest) matches.
    type: bool
    default: false
  progress_file:
    description:
      - JSON file updated about once a second with C(bytes_done), C(bytes_total), C(percent),
        C(rate_mbs), C(eta_s), C(state) and C(file), for polling while the module runs with C(async).
    type: path
  timeout:
    description:
      - Seconds without data (connect or read) before a connection counts as stalled and is retried (1 to
        86400).
      - A metadata request (a HEAD, a listing) must also end within 4 x O(timeout) in all.
    type: int
    default: 30
  retries:
    description: Retries per range (reset whenever data arrives) and per metadata request (0 to 1000).
    type: int
    default: 8
  retry_delay:
    description:
      - First backoff delay in seconds (0 to 3600); doubles per retry up to 60. A Retry-After header wins.
    type: float
    default: 2.0
  free_space_margin:
    description: Bytes that must stay free in O(dest) on top of what the run still needs to write.
    type: int
    default: 268435456
  lock_timeout:
    description:
      - Seconds to wait for another run that holds the lock on the same destination (0 to 604800); then
        the run fails, naming the other run's pid. After the wait the files are usually present and verified.
    type: int
    default: 600
"""
