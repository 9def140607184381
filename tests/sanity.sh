#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# ansible-test sanity needs the collection at .../ansible_collections/llmops/serving (a real path, not a
# symlink), so it runs on a copy of the files that ship (galaxy.yml, meta/, plugins/, roles/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work="$root/.cache/sanity/ansible_collections/llmops/serving"
rm -rf "$work" && mkdir -p "$work"
cp -a "$root/galaxy.yml" "$root/meta" "$root/plugins" "$root/roles" "$root/README.md" "$work/"
find "$work" -name __pycache__ -prune -exec rm -rf {} +
# ansible-test bootstraps pip in its venvs with a script from a host out of reach here: give it ours.
pip_version=$(python - <<'PY'
import re, ansible_test._internal.python_requirements as r, inspect
print(re.search(r"pip='([0-9.]+)'", inspect.getsource(r)).group(1))
PY
)
mkdir -p ~/.ansible/test/cache
cp "$root/tests/sanity_get_pip.py" ~/.ansible/test/cache/get_pip_${pip_version//./_}.py
cd "$work"
git init -q . && git add -A >/dev/null
# validate-modules: DOCUMENTATION/EXAMPLES/RETURN match the argument spec; the others are style rules.
ansible-test sanity --requirements --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  --test validate-modules --test pep8 --test pylint --test compile --test action-plugin-docs \
  --test empty-init --test no-assert --test no-get-exception --test shebang --test use-argspec-type-path \
  --test symlinks --test line-endings --test yamllint --test ansible-doc --test runtime-metadata \
  --color no "$@"
