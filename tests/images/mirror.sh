# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Sourced by build.sh and cuda.sh: the Debian mirror this machine's own apt configuration uses (never written
# into the repository). debootstrap takes any suite from it, so a bookworm machine's mirror serves trixie too.
debian_mirror() {
  # deb822 sources first (Debian 12 default), then one-line sources.list entries.
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/{u=$2} /^Suites:/{ if ($0 ~ /(bookworm|trixie)( |$)/ && u !~ /security/) {print u; exit} }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1=="deb" && $0 !~ /security/ && $0 ~ / main/ {for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
}
