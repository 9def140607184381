# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
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

# How recent a change may be and still hide a second one: file times advance a granule at a time, so a file
# written again within the granule of its last change keeps its identity (git's "racily clean" rule).
# A filesystem that keeps sub-second times (XFS, ext4, btrfs: the kernel's clock tick, a few milliseconds)
# needs a tenth of a second; one whose times are whole seconds (ext3, some NFS servers) needs the second.
# An NFS server whose clock runs behind the node's is not covered.
SETTLED_FINE_S = 0.1
SETTLED_WHOLE_S = 1.0


def identity(st):
    """{size, mtime_ns, ctime_ns, inode} of an os.stat_result."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def same_identity(record, other):
    """Whether two mappings hold the same identity: every one of the FIELDS present and equal (other keys
    are the callers'). A record missing a field never matches."""
    if not (isinstance(record, dict) and isinstance(other, dict)):
        return False
    return all(record.get(name) is not None and record.get(name) == other.get(name) for name in FIELDS)


def same_file(record, st):
    """Whether `st` (an os.stat_result, or None for a missing file) is a regular file with the identity that
    `record` (a mapping with the FIELDS) holds. A record missing a field never matches."""
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    return same_identity(record, identity(st))


def settled(st, now):
    """Whether the last change of the file `st` describes (its ctime) is old enough at `now` (time.time())
    that any later change must give the file another identity. A ctime of a whole second may come from a
    filesystem with one-second times: it needs SETTLED_WHOLE_S, others SETTLED_FINE_S."""
    margin = SETTLED_WHOLE_S if st.st_ctime_ns % 1000000000 == 0 else SETTLED_FINE_S
    return st.st_ctime_ns < (now - margin) * 1e9
