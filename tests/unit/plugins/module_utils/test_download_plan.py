# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download's option schema (written once, in download_options.OPTIONS) and its decide/apply pair:
the module's DOCUMENTATION, argument spec and the logic's defaults cannot drift apart, and check mode
reports what a real run then does."""
import json
import os

from ansible_collections.llmops.serving.plugins.module_utils._download import options as download_options
from ansible_collections.llmops.serving.plugins.module_utils._download import parts as download_parts
from ansible_collections.llmops.serving.plugins.modules import model_download

from tests.fixtures.fake_hub.helpers import dl, params
from tests.helpers import module_doc
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs


def test_documentation_equals_the_option_schema():
    doc = module_doc(model_download, file_options=False)["options"]
    schema = download_options.OPTIONS
    assert sorted(doc) == sorted(schema)
    assert len(schema) == 22
    for name, spec in schema.items():
        opt = doc[name]
        assert opt["type"] == spec["type"], name
        assert opt.get("default") == spec.get("default"), name
        assert opt.get("choices") == spec.get("choices"), name
        assert bool(opt.get("required")) == bool(spec.get("required")), name
        assert bool(opt.get("no_log")) is False, name  # no_log is the spec's business, not documented
    assert schema["token"]["no_log"] is True and schema["url_query"]["no_log"] is True


def test_module_argument_spec_and_defaults_come_from_the_schema():
    kwargs = capture_module_kwargs(model_download)
    assert kwargs["argument_spec"] == download_options.OPTIONS
    assert kwargs["argument_spec"] is not download_options.OPTIONS  # a copy: AnsibleModule may change it
    for rule, value in download_options.OPTION_RULES.items():
        assert kwargs[rule] == value
    assert kwargs["supports_check_mode"] and kwargs["add_file_common_args"]
    schema = download_options.OPTIONS
    assert download_options.DEFAULTS == dict((k, v.get("default")) for k, v in schema.items())
    o = download_options.normalize({"repo": "org/m", "filename": "m.gguf", "dest": "/srv/models",
                                    "endpoint": "https://hub.example"})
    assert o["revision"] == "main"  # the hub's default branch (ModelScope: master)
    for name, default in download_options.DEFAULTS.items():
        if name not in ("repo", "filename", "dest", "endpoint", "token", "lock_timeout", "revision"):
            assert o[name] == default, name


def test_decide_gives_actions_with_reasons_and_writes_nothing(hub, dest, model):
    o = dl.normalize(params(hub, dest))
    plan = dl.decide(o, dl.build_targets(o))
    (step,) = plan.steps
    assert step.action == "download" and step.reason and step.resumable == 0
    assert os.listdir(str(dest)) == []
    dl.run(params(hub, dest))
    plan = dl.decide(o, dl.build_targets(o))
    assert [s.action for s in plan.steps] == ["keep"] and "sidecar" in plan.steps[0].reason


def test_check_mode_reports_the_resume_a_real_run_makes(hub, dest, model):
    """A partial download: check mode says how much a real run resumes, and a stale state counts 0."""
    hub.set_fault("cut", after=1024 * 1024, times=1)
    try:
        dl.run(params(hub, dest, retries=0, connections=1))
    except dl.DownloadError:
        pass
    o = dl.normalize(params(hub, dest))
    t = dl.build_targets(o)[0]
    checked = dl.run(params(hub, dest), check_mode=True)
    part = checked["parts"][0]
    assert part["action"] == "download" and part["reason"]
    dl.fetch_metadata(o, t, dl.Session())
    assert checked["resumed_from"] == download_parts.resumable_bytes(o, t) > 0
    state = download_parts.state_path(t)
    with open(state) as f:
        data = json.load(f)
    data["identity"]["sha256"] = "0" * 64  # another version of the file: nothing may be resumed
    with open(state, "w") as f:
        json.dump(data, f)
    assert dl.run(params(hub, dest), check_mode=True)["resumed_from"] == 0
    real = dl.run(params(hub, dest))
    assert real["resumed_from"] == 0 and real["changed"]
