"""The generated Triton source through Triton's real compiler, for an H100 (sm_90), without a GPU.

The interpreter runs every kernel in the other tests but accepts more than the compiler does;
here the same sources go through Triton's AST -> TTIR -> ... -> PTX pipeline, and the PTX of the
headline kernel must move data in 16-byte vectors.
"""
import re
import types

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.fusion import erf, exp, fuse, log, maximum, minimum, rsqrt, sigmoid, sqrt, tanh, where

triton = pytest.importorskip("triton")

# These build plans on CPU tensors through the interpreter, then compile them offline for sm_90.
# On a GPU machine there is no interpreter; there the fused kernels compile and run for real in
# the other fusion tests (with OPFORGE_CHECK_LAUNCH_KEYS=1 checking every launch key).
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="offline sm_90 compile check, for machines without a GPU")

POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.bool: "*i1",
           torch.int32: "*i32", torch.int64: "*i64", torch.int8: "*i8", torch.uint8: "*u8", torch.int16: "*i16",
           torch.float64: "*fp64"}
CONSTEXPRS = ("BLOCK", "BLOCK_M", "BLOCK_N")


def _compile_ptx(f, args, monkeypatch):
    """Build f's plan for args on the CPU, then compile its kernel source for sm_90 and return the PTX."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with opforge.backend("triton"):
        f(*args)
    plan = next(iter(f._plans.values()))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)     # a real @triton.jit, not the interpreter's
    module = types.ModuleType("compiled_for_test")
    exec(compile(plan.source, plan.note.split(" in ")[-1], "exec"), module.__dict__)
    kernel = next(v for k, v in vars(module).items() if k.endswith("_kernel"))
    outs = [torch.empty(0, dtype=d) for d in plan.dtypes]
    ins = [args[p] for p in plan.positions]
    values = [*outs, *ins, *plan.tail]
    signature, constants, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, values)):
        if name in CONSTEXPRS:
            signature[name], constants[(i,)] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = POINTER[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1 and not name.startswith("s"):    # Triton specializes integers equal to 1
            signature[name], constants[(i,)] = "constexpr", 1
        else:
            signature[name] = "i32" if abs(value) < 2**31 else "i64"
            if value % 16 == 0 and not name.startswith("s"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constants, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": plan.num_warps})
    return compiled.asm["ptx"]


@pytest.fixture
def ptx_of(monkeypatch):
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"Triton's NVIDIA backend is not installed: {exc}")
    return lambda f, args: _compile_ptx(f, args, monkeypatch)


def bias_gelu_residual(x, b, r, scale: float):
    return F.gelu(x + b) * scale + r


def test_headline_kernel_compiles_to_16_byte_vector_accesses(ptx_of):
    bf = torch.bfloat16
    args = (torch.randn(64, 4096, dtype=bf), torch.randn(4096, dtype=bf), torch.randn(64, 4096, dtype=bf), 0.5)
    ptx = ptx_of(fuse(bias_gelu_residual), args)
    assert len(re.findall(r"ld\.global\S*\.v4", ptx)) >= 3      # x, b and r, 16 bytes per access
    assert re.search(r"st\.global\S*\.v4", ptx)
    assert not re.search(r"ld\.global(\.\w+)*\.(b16|u16)\s", ptx)  # no scalar 2-byte loads


def test_every_operation_compiles(ptx_of):
    def everything(x, y, s, n, flag, i, m):
        a = log(abs(x) + 1) + sqrt(abs(y)) + rsqrt(abs(x) + 1) + tanh(x) * erf(y) + sigmoid(x) * exp(y * 0.1)
        b = minimum(x, y) - maximum(x, float("nan")) + x ** 3 + abs(x) ** 1.7 + x ** -2 + y ** 0 + x ** 70
        c = where(flag, a, b) * s + n + F.gelu(x, approximate="tanh") + F.silu(y) + F.relu(x)
        m = ((x > 0) & (y < 1)) | ~(x > y) ^ (x == y)
        k = where(m, i * 3, -i) + (m * 2) + i / 2 + maximum(i, 0)
        return c, m, x.to(torch.bfloat16), x.int(), where(m, 1.0, float("-inf")), exp(s) * x, F.gelu(s) + x, k
    args = (torch.randn(8, 32), torch.randn(32), 0.5, 3, True, torch.randint(-4, 4, (8, 32), dtype=torch.int32),
            torch.rand(32) > 0.5)
    fused = fuse(everything)
    ptx_of(fused, args)
    with opforge.backend("triton"):          # and the kernel's values (interpreter) are torch's
        got = fused(*args)
    want = everything(args[0], args[1], torch.tensor(args[2]), *args[3:])   # eager torch: F.gelu needs a tensor
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, index
        if g.is_floating_point():   # bfloat16: the interpreter truncates where torch rounds (one unit)
            rtol = 2.0 ** -7 if g.dtype == torch.bfloat16 else 1e-5
            assert torch.allclose(g.double(), w.double(), rtol=rtol, atol=1e-6, equal_nan=True), index
        else:
            assert torch.equal(g, w), index


def test_strided_three_d_and_int64_indexing_compile(ptx_of):
    g = fuse(lambda x, b: x + b)
    big = torch.empty(()).expand(2**16, 2**15 + 16)    # 2**31+ elements, no memory: int64 offsets
    with opforge.backend("triton"):
        plan_source = g.source("cpu", big, torch.randn(2**15 + 16))
    assert "pid_m.to(tl.int64)" in plan_source
    f = fuse(lambda x, y, z: (x * y + z, x > z))
    x = torch.randn(3, 4, 10)[:, :, ::2]
    ptx_of(f, (x, torch.randn(4, 5), torch.randn(3, 1, 5)))


def test_plan_launch_keys_determine_tritons_generic_key(monkeypatch):
    """Equal plan keys must mean equal generic keys (else a cached binary would be launched with
    arguments it was not specialized for)."""
    from opforge.runtime.triton.launch import TritonLauncher

    f = fuse(lambda x, b, s, n, flag: where(flag, x + b * s, x - n))
    base = torch.randn(6, 40)
    misaligned = torch.randn(6 * 40 + 1)[1:].view(6, 40)     # same plan, data 4 bytes off 16
    calls = [(base, torch.randn(40), 0.5, 1, True), (base, torch.randn(40), 2.0, 16, True),
             (base, torch.randn(40), 2.0, 3, False), (base, torch.randn(40), 2.0, 2**33, False),
             (misaligned, torch.randn(40), 0.5, 1, True)]
    with opforge.backend("triton"):
        f(*calls[0])
    plan = next(iter(f._plans.values()))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    module = types.ModuleType("keyed_for_test")
    exec(compile(plan.source, plan.note.split(" in ")[-1], "exec"), module.__dict__)
    kernel = next(v for k, v in vars(module).items() if k.endswith("_kernel"))
    generic = TritonLauncher(kernel)._key
    seen: dict = {}
    for args in calls:
        ins = [args[p] for p in plan.positions]
        outs = [torch.empty(plan.shape, dtype=d) for d in plan.dtypes]
        mine = plan.launch_key(ins)
        theirs = generic((*outs, *ins, *plan.tail), plan.num_warps, 2)
        assert seen.setdefault(mine, theirs) == theirs
    assert len(seen) == 5
