# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run every benchmark under bench/ (each bench/<name>/run.py), one after another; exit 1 if any failed."""
import glob
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
failed = []
for script in sorted(glob.glob(os.path.join(here, "*", "run.py"))):
    name = os.path.basename(os.path.dirname(script))
    print("\n=== bench %s" % name, flush=True)
    if subprocess.call([sys.executable, script]) != 0:
        failed.append(name)
print("\nbenchmarks failed: %s" % ", ".join(failed) if failed else "\nall benchmark goals met")
sys.exit(1 if failed else 0)
