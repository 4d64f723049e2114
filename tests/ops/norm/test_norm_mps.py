"""The Metal kernels on a real Apple GPU (MPS tensors), checked the same way as in the emulator.

Skipped wherever ``torch.backends.mps.is_available()`` is False (every Linux CI machine).
"""
import pytest
import torch

import opforge
from opforge.runtime.metal import library as metal_runtime
from opforge.ops.norm import metal as norm_metal
from opforge.ops.norm.problem import OPS

from metal_emu.checks import DTYPES, ROWS, SIZES, VARIANTS, expected_variant, run
from metal_emu.mps import MPS, needs_mps, real_metal  # noqa: F401 (real_metal: an autouse fixture)

pytestmark = needs_mps


def _bfloat_ok() -> bool:
    return metal_runtime.bfloat_reason(torch.bfloat16, "mps", norm_metal.SOURCE, norm_metal.kernel_name(
        "layer_norm", "looped", torch.bfloat16, torch.bfloat16)) is None


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_each_variant_at_each_size_on_mps(op, dtype, variant):
    if dtype == torch.bfloat16 and not _bfloat_ok():
        pytest.skip("this macOS's Metal has no bfloat")
    for n in SIZES[variant]:
        run(op, (ROWS[variant], n), dtype, device="mps", variant=variant)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(4096, 128), (512, 4096), (64, 32768), (3, 100003)])
def test_large_shapes_on_mps(op, dtype, shape):
    event = run(op, shape, dtype, device="mps")
    assert event.device.startswith("mps") and event.variant == expected_variant(shape[-1])


@pytest.mark.parametrize("op", OPS)
def test_strided_rows_and_fp32_weights_on_mps(op):
    event = run(op, (2, 3, 1500), torch.float16, device="mps", layout="strided", weight_dtype=torch.float32)
    assert event.note == ""


def test_mps_runs_metal_by_default_and_is_traced():
    x = torch.randn(4, 1024, device="mps")
    with opforge.trace() as t:
        opforge.rms_norm(x)
    assert t[0].backend == "metal" and t[0].device.startswith("mps")


def test_bad_input_on_mps_gets_the_usual_errors():
    x = torch.randn(4, 16, device="mps")
    with pytest.raises(ValueError, match=r"weight must have shape \(16,\)"):
        opforge.layer_norm(x, torch.randn(15, device="mps"))
    with pytest.raises(ValueError, match="weight is on cpu"):
        opforge.layer_norm(x, torch.randn(16))
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        opforge.add_rms_norm(x, x.half())


def test_device_info_reports_the_mps_device():
    info = opforge.device_info("mps")
    assert info.kind == "mps" and info.max_threads_per_block == 1024
    assert info.recommended_working_set_bytes is None or info.recommended_working_set_bytes > 0


def test_compile_errors_surface_as_syntax_errors():
    with pytest.raises(SyntaxError):
        torch.mps.compile_shader("kernel void broken(device float* x) { x[0] = undeclared; }")
