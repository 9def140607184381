# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The benchmark client (module llm_benchmark) and the load an endpoint carries.

Private to llmops.serving: no API promise to other collections; import paths may change."""
