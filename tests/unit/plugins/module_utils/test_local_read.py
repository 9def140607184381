# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""local_read (issue 34): a small local file is read only when it is a regular file, within its cap, without
ever blocking on a FIFO or reading a device to its (absent) end; and the readers that use it (firewall's
record here; config.json, sysfs and /proc in their own modules' tests)."""
import errno
import os
import signal
from contextlib import contextmanager

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._files import local_read as lr
from ansible_collections.llmops.serving.plugins.module_utils._serving import firewall as fw


@contextmanager
def within(seconds):
    """Fail the test (instead of hanging it) when the block takes longer than `seconds`: a regression that
    opens a FIFO without O_NONBLOCK blocks forever in open()."""
    def expired(_signum, _frame):
        raise TimeoutError("still running after %s s: the read blocked" % seconds)
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 64}')
    assert lr.read_bytes(str(path), 100) == b'{"num_hidden_layers": 64}'
    assert lr.read_json(str(path), 100) == {"num_hidden_layers": 64}
    assert lr.read_text(str(path), 25) == '{"num_hidden_layers": 64}'  # exactly the cap is within it


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = str(tmp_path / "config.json")
    os.mkfifo(fifo)
    with within(5), pytest.raises(lr.LocalReadError, match="is a FIFO .named pipe., not a regular file"):
        lr.read_json(fifo, 1024, "the model's config.json")


def test_a_link_to_dev_zero_is_refused_followed_or_not(tmp_path):
    link = str(tmp_path / "config.json")
    os.symlink("/dev/zero", link)
    with within(5):
        with pytest.raises(lr.LocalReadError, match=r"is a symbolic link \(to /dev/zero\)"):
            lr.read_bytes(link, 1024)
        with pytest.raises(lr.LocalReadError, match="is a character device"):
            lr.read_bytes(link, 1024, follow=True)


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    with open(str(path), "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that would all be read
    with pytest.raises(lr.LocalReadError, match="is 1073741824 bytes, over the limit of 4096") as err:
        lr.read_bytes(str(path), 4096)
    assert err.value.errno == errno.EFBIG


def test_a_file_that_reports_size_0_is_read_only_up_to_the_cap():
    # /proc files report size 0 (sysfs 4096): the cap holds on what is read, not on what stat says
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(lr.LocalReadError, match="holds more than that, over the limit of 16 bytes"):
        lr.read_bytes("/proc/self/status", 16)
    assert lr.read_text("/proc/self/status", 1 << 20).startswith("Name:")


def test_not_utf8_and_not_json_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "vendor"
    path.write_bytes(b"0x10de\xff\n")
    with pytest.raises(lr.LocalReadError, match=r"attribute .*vendor is not UTF-8 text \(byte 6 is 0xff\)"):
        lr.read_text(str(path), 100, "the attribute")
    path.write_text("{")
    with pytest.raises(lr.LocalReadError, match="is not JSON"):
        lr.read_json(str(path), 100)
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(lr.LocalReadError, match="nested too deeply"):
        lr.read_json(str(path), 1 << 20)


def test_a_missing_file_keeps_its_errno(tmp_path):
    with pytest.raises(lr.LocalReadError) as err:
        lr.read_bytes(str(tmp_path / "absent"), 10)
    assert err.value.errno == errno.ENOENT and "No such file" in str(err.value)
    assert isinstance(err.value, OSError)


def test_firewall_record_as_a_fifo_or_a_device_link_is_no_record(tmp_path):
    """A record that is a FIFO or a link to /dev/zero is a problem the module says (and keeps aside) at
    once."""
    fifo, link, real = str(tmp_path / "fifo.json"), str(tmp_path / "zero.json"), tmp_path / "real.json"
    os.mkfifo(fifo)
    os.symlink("/dev/zero", link)
    with within(5):
        for path in (fifo, link):
            zones, problem = fw.read_record(path)
            assert zones == {} and "cannot be read" in problem
    real.write_text('{"zones": {"public": [["port", "8080/tcp", ""]]}}')
    assert fw.read_record(str(real)) == ({"public": [("port", "8080/tcp", "")]}, None)
