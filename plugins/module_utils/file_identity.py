# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stat identity of a file: the one rule by which the collection trusts that a file it read or hashed
before has not changed since.

The identity is size, mtime_ns, ctime_ns and inode. Writing the file, ``touch``, ``utime`` (a restored
mtime), chmod/chown or replacing it all change ctime, which a user cannot set back, so any of them makes the
file a different one. Used by the model sidecar (model_sidecar.py: skip hashing a verified file), the
snapshot manifest (snapshot_store.py), gguf_info (the identity of the file whose header it read) and
node_state_info (the identity of each file it reads, so that a header read last run can be reused).

Plain Python 3.6, standard library only.
"""
from __future__ import absolute_import, division, print_function

import stat

__metaclass__ = type

FIELDS = ("size", "mtime_ns", "ctime_ns", "inode")


def identity(st):
    """{size, mtime_ns, ctime_ns, inode} of an os.stat_result."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def same_file(record, st):
    """Whether `st` (an os.stat_result, or None for a missing file) is a regular file with the identity that
    `record` (a mapping with the FIELDS) holds. A record missing a field never matches."""
    if st is None or not stat.S_ISREG(st.st_mode) or not isinstance(record, dict):
        return False
    return all(record.get(name) is not None for name in FIELDS) and record == dict(record, **identity(st))
