#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: download_wait
short_description: Wait for an async download job and print its progress while it runs
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Waits for an async job started with C(async) and C(poll=0), typically M(llmops.serving.model_download)
    with its O(llmops.serving.model_download#module:progress_file) set.
  - Every O(interval) seconds prints one line per host with the state, percent, MB done/total, MB/s and the
    estimated seconds left, read from the progress file the job writes on the node.
  - Each wait is one command on the node that returns as soon as the job's async record is final, so the task
    ends within a second of the job.
  - Returns the job's final result as M(ansible.builtin.async_status) does. When the job has not ended within
    O(timeout) seconds (plus 30 s for the async wrapper to record its own timeout), returns the last status
    with C(finished=0) and fails.
  - This is an action plugin; the node needs a POSIX C(/bin/sh).
options:
  jid:
    description:
      - Job id of the async task (its registered C(ansible_job_id)).
    type: str
    required: true
  progress_file:
    description:
      - Path on the node of the JSON progress file the job writes.
    type: path
    required: true
  interval:
    description:
      - Seconds between two progress lines.
    type: int
    default: 30
  timeout:
    description:
      - Seconds the job may run; use the task's C(async) value.
    type: int
    required: true
  label:
    description:
      - Name printed before each progress line, such as the model's name.
    type: str
seealso:
  - module: llmops.serving.model_download
  - module: ansible.builtin.async_status
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llmops.serving.attributes
  - ansible.builtin.action_common_attributes.flow
"""

EXAMPLES = r"""
- name: Start the download as an async job
  llmops.serving.model_download:
    repo: Qwen/Qwen3-8B-GGUF
    filename: Qwen3-8B-Q4_K_M.gguf
    dest: /srv/models/qwen3
    progress_file: /srv/models/qwen3/.progress.json
  async: 14400
  poll: 0
  register: download_job

- name: Wait for the download, printing its progress every 30 seconds
  llmops.serving.download_wait:
    jid: "{{ download_job.ansible_job_id }}"
    progress_file: /srv/models/qwen3/.progress.json
    interval: 30
    timeout: 14400
    label: qwen3
  register: download
"""

RETURN = r"""
finished:
  description: Whether the job has ended (V(1)) or not (V(0)).
  returned: always
  type: int
  sample: 1
started:
  description: Whether the job was started (V(1)).
  returned: always
  type: int
  sample: 1
ansible_job_id:
  description: The job id waited for.
  returned: always
  type: str
  sample: "j123456789.4321"
results_file:
  description: Path on the node of the job's async record.
  returned: always
  type: str
  sample: /root/.ansible_async/j123456789.4321
"""
