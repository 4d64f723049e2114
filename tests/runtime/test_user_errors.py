"""Errors a new user hits on CPU: each gives a clear message, not a traceback from deep inside."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opforge
from opforge.runtime.compile_support import InferenceOnlyError
from opforge.testing import rel_error

SRC = str(Path(opforge.__file__).resolve().parents[1])


def test_verify_with_an_unknown_op_name_fails_and_lists_the_known_ones():
    result = subprocess.run([sys.executable, "-m", "opforge", "verify", "--ops", "rmsnorm"], capture_output=True,
                            text=True, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 2
    assert "unknown op rmsnorm" in result.stderr and "rms_norm" in result.stderr


def test_numpy_eps_from_a_model_config_is_accepted():
    x = torch.randn(3, 64)
    y = opforge.rms_norm(x, eps=np.float32(1e-5))
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + float(np.float32(1e-5)))
    assert rel_error(y, ref) < 1e-5
    with pytest.raises(TypeError, match="eps must be a real number"):
        opforge.rms_norm(x, eps="1e-5")


def test_fused_functions_refuse_inputs_that_require_grad_and_run_under_no_grad():
    f = opforge.fuse(lambda a, b: opforge.gelu(a) * b)
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    with pytest.raises(InferenceOnlyError, match=r"torch\.no_grad\(\)"):
        f(a, b)
    with torch.no_grad():
        out = f(a, b)
    assert rel_error(out, torch.nn.functional.gelu(a.double()) * b.double()) < 1e-5
