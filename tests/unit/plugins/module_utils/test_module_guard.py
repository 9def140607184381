# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""module_guard.run_module, every module's main(): the module's known errors (``expected``) fail the task with
their message alone, anything else with one line naming the module, check mode is supported unless a module
says otherwise, and the module's argument spec constant is never changed."""
import pytest
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module

SPEC = {"name": {"type": "str"}, "token": {"type": "str", "no_log": True}}


class KnownError(Exception):
    """A refusal of the module's own logic."""


class NarrowerError(KnownError):
    pass


class FakeModule(object):
    """What run_module needs of an AnsibleModule: the keyword arguments it was built with, params, and
    fail_json ending the module as Ansible's does (SystemExit, which no handler of the module catches)."""

    built = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.argument_spec = kwargs.get("argument_spec", {})
        self.params = {"name": "qwen", "token": "hf_secret_value"}
        self.no_log_values = set()
        self.failed = None
        FakeModule.built.append(self)

    def fail_json(self, **result):
        self.failed = result
        raise SystemExit(1)


def run(work, **kwargs):
    """run_module(FakeModule, "demo", work, ...): the module it built."""
    FakeModule.built = []
    try:
        run_module(FakeModule, "demo", work, argument_spec=SPEC, **kwargs)
    except SystemExit:
        pass
    (module,) = FakeModule.built
    return module


def raising(exc):
    def work(module):
        raise exc
    return work


def test_an_expected_error_is_the_failure_message_alone():
    module = run(raising(KnownError("reserve must be bytes or a size such as 2GiB")), expected=(KnownError,))
    assert module.failed == {"msg": "reserve must be bytes or a size such as 2GiB", "changed": False}


def test_a_subclass_of_an_expected_error_is_expected_too():
    module = run(raising(NarrowerError("refused")), expected=(ValueError, KnownError))
    assert module.failed == {"msg": "refused", "changed": False}


def test_an_error_not_expected_names_the_module_and_its_type_and_hides_secrets():
    module = run(raising(RuntimeError("bug near hf_secret_value")), expected=(KnownError,))
    assert module.failed["changed"] is False
    assert module.failed["msg"].startswith("demo failed: RuntimeError: bug near ")
    assert "hf_secret_value" not in module.failed["msg"]
    # without `expected`, a module's own error class is unexpected as well
    assert run(raising(KnownError("x"))).failed["msg"] == "demo failed: KnownError: x"


def test_a_module_that_ends_itself_is_left_alone():
    def work(module):
        module.fail_json(msg="short of space", filesystems=[])
    module = run(work, expected=(KnownError,))
    assert module.failed == {"msg": "short of space", "filesystems": []}
    done = run(lambda module: None, expected=(KnownError,))
    assert done.failed is None


def test_check_mode_is_supported_unless_the_module_says_otherwise_and_the_spec_is_a_copy():
    module = run(lambda module: None)
    assert module.kwargs["supports_check_mode"] is True
    assert module.kwargs["argument_spec"] == SPEC and module.kwargs["argument_spec"] is not SPEC
    module.kwargs["argument_spec"]["name"]["type"] = "int"  # what AnsibleModule may do to the spec it gets
    assert SPEC["name"]["type"] == "str"
    assert run(lambda module: None, supports_check_mode=False).kwargs["supports_check_mode"] is False
    assert "expected" not in module.kwargs  # run_module's own argument, never AnsibleModule's


@pytest.mark.parametrize("expected", [(), [KnownError], (KnownError, OSError)])
def test_expected_takes_any_sequence_of_exception_classes(expected):
    module = run(raising(OSError("disk gone")), expected=expected)
    if OSError in expected:
        assert module.failed == {"msg": "disk gone", "changed": False}
    else:
        assert module.failed["msg"] == "demo failed: OSError: disk gone"
