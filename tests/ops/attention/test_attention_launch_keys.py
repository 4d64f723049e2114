"""The explicit launch keys of the decode kernels are sound (checked without a GPU)."""
from pathlib import Path

import pytest

from opforge.testing import run_launch_key_probe


def test_each_decode_launch_key_stands_for_one_specialization():
    pytest.importorskip("triton")
    assert "each one specialization" in run_launch_key_probe(Path(__file__).with_name("launch_keys_probe.py"))
