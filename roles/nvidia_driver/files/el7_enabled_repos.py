#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""List the ENABLED yum repositories of an EL 7 host that point at dead hosts (mirrorlist.centos.org).

Run by roles/nvidia_driver/tasks/setup-RedHat.yml with the host's /usr/bin/python (python 2.7 on EL 7;
also runs under python 3.6+). Standard library only. It reads the repositories the way yum 3.4 does:
  * repository sections of /etc/yum.conf (every section but [main]) and of the *.repo files (only those)
    in each reposdir (yum.conf [main] reposdir=, default /etc/yum.repos.d /etc/yum/repos.d);
  * a section without enabled= is enabled; enabled accepts 1/0, yes/no, true/false, on/off;
  * skip_if_unavailable (per repository, else [main], else off): yum skips such a repository when it
    cannot reach it instead of failing, so it is listed apart, not as dead.
Prints one JSON object: files read, enabled repository ids, dead (file, section, option, value),
skipped_if_unavailable, errors (files yum could not parse either). Exit status 0 unless it crashed.
"""
from __future__ import print_function

import argparse
import glob
import io
import json
import os
import sys

try:  # python 3
    import configparser  # novermin

    def new_parser():
        return configparser.RawConfigParser(  # novermin (python 3 branch)
            strict=False, interpolation=None, inline_comment_prefixes=(";",))

    def read_into(parser, handle, name):
        parser.read_file(handle, source=name)  # novermin
except ImportError:  # python 2.7 (EL 7 /usr/bin/python)
    import ConfigParser as configparser  # noqa: N813  # novermin

    def new_parser():
        return configparser.RawConfigParser()

    def read_into(parser, handle, name):
        parser.readfp(handle, name)


FALSE = ("0", "no", "false", "off")
TRUE = ("1", "yes", "true", "on")
URL_OPTIONS = ("mirrorlist", "metalink", "baseurl")
DEFAULT_REPOSDIRS = ["/etc/yum.repos.d", "/etc/yum/repos.d"]


def as_bool(value, default):
    if value is None:
        return default
    value = value.strip().lower()
    if value in FALSE:
        return False
    if value in TRUE:
        return True
    return default


def option(parser, section, name):
    if parser.has_option(section, name):
        return parser.get(section, name)
    return None


def parse(path, errors):
    parser = new_parser()
    try:
        with io.open(path, "r", encoding="utf-8", errors="replace") as handle:
            read_into(parser, handle, path)
    except (configparser.Error, IOError, OSError, UnicodeDecodeError) as exc:
        errors.append("%s: %s" % (path, " ".join(str(exc).split())))
        return None
    return parser


def uses_dead_host(value, hosts):
    # baseurl may hold several URLs (whitespace or commas, continuation lines).
    for url in value.replace(",", " ").split():
        rest = url.split("://", 1)[-1]
        host = rest.split("/", 1)[0].split("?", 1)[0].split("@")[-1].split(":", 1)[0].lower()
        if host in hosts:
            return True
    return False


def check(yum_conf, reposdirs, hosts):
    report = {"files": [], "enabled": [], "dead": [], "skipped_if_unavailable": [], "errors": []}
    sources = []
    skip_default = False
    if yum_conf and os.path.isfile(yum_conf):
        conf = parse(yum_conf, report["errors"])
        if conf is not None:
            report["files"].append(yum_conf)
            if conf.has_section("main"):
                skip_default = as_bool(option(conf, "main", "skip_if_unavailable"), False)
                if not reposdirs and option(conf, "main", "reposdir"):
                    reposdirs = option(conf, "main", "reposdir").replace(",", " ").split()
            sources.append((yum_conf, conf))
    for directory in reposdirs or DEFAULT_REPOSDIRS:
        for path in sorted(glob.glob(os.path.join(directory, "*.repo"))):
            parser = parse(path, report["errors"])
            if parser is not None:
                report["files"].append(path)
                sources.append((path, parser))
    for path, parser in sources:
        for section in parser.sections():
            if section == "main":
                continue
            if not as_bool(option(parser, section, "enabled"), True):
                continue
            report["enabled"].append(section)
            dead = [(name, option(parser, section, name)) for name in URL_OPTIONS
                    if option(parser, section, name) and uses_dead_host(option(parser, section, name), hosts)]
            if not dead:
                continue
            if as_bool(option(parser, section, "skip_if_unavailable"), skip_default):
                report["skipped_if_unavailable"].append(section)
                continue
            for name, value in dead:
                report["dead"].append({"file": path, "section": section, "option": name,
                                       "value": " ".join(value.split())})
    return report


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--yum-conf", default="/etc/yum.conf")
    args.add_argument("--reposdir", action="append", default=[],
                      help="directory of *.repo files (repeatable; default: yum.conf reposdir)")
    args.add_argument("--dead-host", action="append", default=[], help="host name that no longer serves EL 7")
    opts = args.parse_args(argv)
    hosts = set(h.lower() for h in opts.dead_host)
    print(json.dumps(check(opts.yum_conf, opts.reposdir, hosts), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
