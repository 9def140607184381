# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Stand-in for ansible-test's pip bootstrap script (get-pip.py from ci-files.testing.ansible.com).

That host is out of reach here (only the package registries are), so tests/sanity.sh installs this file in
ansible-test's cache: it seeds pip from the interpreter's own ensurepip, then lets pip install the pinned
pip/setuptools that ansible-test asked for, from the configured package index, as get-pip.py would.
"""
import subprocess
import sys

# In a child process: ensurepip points PIP_CONFIG_FILE at /dev/null in its own environment, which would
# hide the machine's pip configuration (index, certificates) from the install below.
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + sys.argv[1:]))
