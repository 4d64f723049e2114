"""The explicit launch keys of the decode kernels are sound (checked without a GPU)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_each_decode_launch_key_stands_for_one_specialization():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3] / "src")
    probe = Path(__file__).with_name("launch_keys_probe.py")
    done = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "each one specialization" in done.stdout
