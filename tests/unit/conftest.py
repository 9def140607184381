"""Fixtures shared by the model_download tests (test_download_*.py)."""
import pytest

from tests.fixtures.fake_hub.helpers import make_dest, start_hub


@pytest.fixture
def hub(tmp_path):
    """A fake hub on 127.0.0.1 with a random port, stopped after the test."""
    yield from start_hub(tmp_path)


@pytest.fixture
def dest(tmp_path):
    """An empty download directory."""
    return make_dest(tmp_path)
