# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Byte ranges: which parts of a file are written (download_parts.py) and which are still missing.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class Ranges:
    """A set of half-open byte intervals [a, b), kept merged and sorted."""

    def __init__(self, items=()):
        self.items = []
        for a, b in items:
            self.add(int(a), int(b))

    def add(self, a, b):
        if b <= a:
            return
        out = []
        placed = False
        for x, y in self.items:
            if y < a:
                out.append([x, y])
            elif b < x:
                if not placed:
                    out.append([a, b])
                    placed = True
                out.append([x, y])
            else:
                a, b = min(a, x), max(b, y)
        if not placed:
            out.append([a, b])
        out.sort()
        self.items = out

    def prefix_end(self):
        if self.items and self.items[0][0] == 0:
            return self.items[0][1]
        return 0

    def total(self):
        return sum(b - a for a, b in self.items)

    def missing(self, size):
        gaps, pos = [], 0
        for a, b in self.items:
            if a > pos:
                gaps.append((pos, min(a, size)))
            pos = max(pos, b)
        if pos < size:
            gaps.append((pos, size))
        return [(a, b) for a, b in gaps if b > a]

    def clip(self, size):
        return Ranges([(a, min(b, size)) for a, b in self.items if a < size])
