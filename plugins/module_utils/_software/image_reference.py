# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Image references (``[registry/]repository[:tag][@sha256:digest]``): the one rule for their registry host.

Shared by the source plan (which registry a pull reaches, the bundle's name of an image) and the llama.cpp
build identity (a digest names the content wherever it is pulled from). Plain Python 3.6, standard library.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


def registry_host(reference):
    """The registry host[:port] of an image reference ('' = Docker Hub). Docker's own rule: the first path
    component is a host when it has a '.' or a ':' or is 'localhost'."""
    first, slash, rest = reference.split("@", 1)[0].partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return ""


def without_registry(reference):
    """The reference without its registry host: ``registry.lan:5000/nvidia/cuda:12.4.1`` ->
    ``nvidia/cuda:12.4.1``."""
    host = registry_host(reference)
    return reference[len(host) + 1:] if host else reference


def content_reference(reference):
    """What identifies the image's content: a reference pinned by digest without its registry host (the same
    digest is the same content from Docker Hub or a mirror); any other reference as it is (a tag in another
    registry can be another image)."""
    return without_registry(reference) if "@sha256:" in reference else reference
