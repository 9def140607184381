# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the benchmarks under bench/ (each bench/<name>/run.py), one after another; exit 1 if any failed.

    python -m bench                  every benchmark except those run on request (ON_REQUEST)
    python -m bench noop [ARGS...]   one benchmark, with its own arguments
"""
import glob
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
# Benchmarks that need more than this checkout (docker, the local demo) and minutes: only when named.
ON_REQUEST = {"noop"}
available = {os.path.basename(os.path.dirname(p)): p for p in glob.glob(os.path.join(here, "*", "run.py"))}

if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
    name = sys.argv[1]
    if name not in available:
        sys.exit("no benchmark %r (bench/<name>/run.py): %s" % (name, ", ".join(sorted(available))))
    sys.exit(subprocess.call([sys.executable, available[name]] + sys.argv[2:]))

failed = []
for name in sorted(set(available) - ON_REQUEST):
    print("\n=== bench %s" % name, flush=True)
    if subprocess.call([sys.executable, available[name]]) != 0:
        failed.append(name)
print("\n(on request only: %s)" % ", ".join("python -m bench %s" % n for n in sorted(ON_REQUEST)))
print("\nbenchmarks failed: %s" % ", ".join(failed) if failed else "\nall benchmark goals met")
sys.exit(1 if failed else 0)
