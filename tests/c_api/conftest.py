"""Fixtures the C API's tests share."""

import pytest

from helpers import build_generate_example


@pytest.fixture(scope="session")
def generate_exe(tmp_path_factory):
    """examples/generate.c built once per session as the README says, warnings as errors."""
    return build_generate_example(tmp_path_factory.mktemp("generate"))
