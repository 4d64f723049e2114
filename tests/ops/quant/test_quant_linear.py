"""opforge.linear: each Triton variant against x.double() @ w.dequantize(float64).T, the torch
path, dense weights, layouts, and the errors raised before anything runs."""
import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.ops.quant import cases, config as qc, triton_kernels as tk
from opforge.ops.quant.problem import DECODE_MAX_M
from opforge.testing import DEVICE, TOLERANCE, rel_error

N, K = 64, 256


def oracle(x, qw, bias=None):
    return cases.oracle((x, qw, bias), {})


def run_triton(x, qw, bias=None):
    with opforge.backend("triton"), opforge.trace() as t:
        y = opforge.linear(x, qw, bias)
    assert len(t) == 1 and t[0].backend == "triton"
    return y, t[0]


def expected_variant(m, bits, n=N, k=K):
    """The Triton variant for M rows of an (n, k) weight: int4 at M 17..64 on a weight of at most
    DEQUANT_SMALL_NK elements is dequant+cuBLAS."""
    from opforge.ops.quant import problem
    small_int4 = bits == 4 and n * k <= problem.DEQUANT_SMALL_NK
    if m <= DECODE_MAX_M:
        return "decode"
    return "dequant_gemm" if small_int4 and m <= problem.DEQUANT_SMALL_MAX_M else "prefill"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16, 17, 33])
def test_kernels_match_the_weight_they_hold(bits, group_size, symmetric, m):
    """Each variant, and the Triton GEMM (``launch``) also where dequant+cuBLAS is chosen."""
    from opforge.ops.quant.problem import prepare
    dtype = torch.float16 if (m + bits) % 2 else torch.bfloat16
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE) * 0.05, bits, group_size, symmetric)
    x = torch.randn(m, K, device=DEVICE, dtype=dtype)
    y, event = run_triton(x, qw)
    assert event.variant == expected_variant(m, bits)
    assert y.shape == (m, N) and y.dtype == dtype
    assert rel_error(y, oracle(x, qw)) < TOLERANCE[dtype]
    if event.variant == "dequant_gemm":
        assert rel_error(tk.launch(prepare(x, qw, None)), oracle(x, qw)) < TOLERANCE[dtype]


@pytest.mark.parametrize("m", [1, 5, 40])
@pytest.mark.parametrize("bits", [4, 8])
def test_float32_scales_from_codes_and_fractional_zeros(m, bits):
    """A GPTQ/AWQ-style import: float32 scales, non-integer zeros, group 64."""
    codes = torch.randint(0, 2 ** bits, (N, K), device=DEVICE)
    scales = torch.rand(N, K // 64, device=DEVICE) * 0.01 + 1e-3
    zeros = torch.rand(N, K // 64, device=DEVICE) * 2 ** bits
    qw = opforge.QuantizedWeight.from_codes(codes, scales, zeros, bits, 64)
    x = torch.randn(m, K, device=DEVICE, dtype=torch.float16)
    y, _ = run_triton(x, qw)
    assert rel_error(y, oracle(x, qw)) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("m", [1, 4, 20])
def test_split_k_and_ragged_edges(m):
    """K long enough to be split across programs; N not a multiple of the tile; per-row groups
    with K not a multiple of the K tile (int8, K=200), int8 K=50 (not whole words: the dot path at M=1)."""
    for n, k, bits, g in [(40, 2048, 4, 128), (24, 200, 8, -1), (72, 1024, 4, 32), (24, 50, 8, -1), (8, 384, 8, 64)]:
        qw = opforge.quantize_weight(torch.randn(n, k, device=DEVICE), bits, g)
        x = torch.randn(m, k, device=DEVICE, dtype=torch.float16)
        bias = torch.randn(n, device=DEVICE, dtype=torch.float16)
        y, _ = run_triton(x, qw, bias)
        assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.float16], (n, k, bits, g)


def test_3d_x_bias_and_strided_rows():
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE), 4, 64)
    bias = torch.randn(N, device=DEVICE, dtype=torch.bfloat16)
    x3 = torch.randn(2, 3, K, device=DEVICE, dtype=torch.bfloat16)
    y, event = run_triton(x3, qw, bias)
    assert y.shape == (2, 3, N) and event.note == ""
    assert rel_error(y, oracle(x3, qw, bias)) < TOLERANCE[torch.bfloat16]
    big = torch.randn(20, 2 * K, device=DEVICE, dtype=torch.float16)
    xs = big[:, 7:7 + K]                           # strided rows, read in place
    y, event = run_triton(xs, qw)
    assert event.note == "" and event.variant == expected_variant(20, 4)
    assert rel_error(y, oracle(xs, qw)) < TOLERANCE[torch.float16]
    xt = torch.randn(K, 5, device=DEVICE, dtype=torch.float16).T   # last dim not contiguous: copied
    y, event = run_triton(xt, qw)
    assert "copied" in event.note
    assert rel_error(y, oracle(xt, qw)) < TOLERANCE[torch.float16]
    x1 = torch.randn(K, device=DEVICE, dtype=torch.float16)        # 1-D x gives (N,)
    y, _ = run_triton(x1, qw)
    assert y.shape == (N,) and rel_error(y, oracle(x1[None], qw)[0]) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_path(dtype):
    qw = opforge.quantize_weight(torch.randn(N, K), 8, 32)
    x = torch.randn(3, K, dtype=dtype)
    bias = torch.randn(N, dtype=dtype)
    with opforge.backend("torch"), opforge.trace() as t:
        y = opforge.linear(x, qw, bias)
    assert t[0].backend == "torch" and t[0].variant == "reference" and y.dtype == dtype
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[dtype]


def test_float32_x_is_not_for_the_kernels():
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE), 4, 128)
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="float16 or bfloat16"):
        opforge.linear(torch.randn(2, K, device=DEVICE), qw)


def test_dense_weight_runs_torch_linear_and_says_so():
    w = torch.randn(N, K)
    x = torch.randn(4, K)
    with opforge.trace() as t:
        y = opforge.linear(x, w)
    assert (t[0].backend, t[0].variant) == ("torch", "dense")
    assert torch.equal(y, F.linear(x, w))


@pytest.mark.parametrize("bits", [4, 8])
def test_explain_names_the_variant(bits):
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE), bits, 128)
    with opforge.backend("triton"):
        text = str(opforge.explain("linear", torch.randn(40, K, device=DEVICE, dtype=torch.float16), qw))
    chosen = expected_variant(40, bits)
    others = {"decode", "prefill", "dequant_gemm"} - {chosen}
    assert f"chosen: triton.{chosen}" in text and all(f"not triton.{v}" in text for v in others)


@pytest.mark.parametrize("call, error, words", [
    (lambda qw: opforge.linear(torch.randn(2, K + 8), qw), ValueError, "must equal the weight's K=256"),
    (lambda qw: opforge.linear(torch.randn(2, K), qw, torch.randn(N + 1)), ValueError, "bias must have shape (64,)"),
    (lambda qw: opforge.linear(torch.randn(2, K), qw, torch.randn(N, dtype=torch.float64)), TypeError,
     "bias must have x's dtype"),
    (lambda qw: opforge.linear(torch.randn(2, K), torch.randn(N, K, dtype=torch.float64)), TypeError,
     "dense w must have x's dtype"),
    (lambda qw: opforge.linear(torch.randn(2, K), torch.randn(2, N, K)), ValueError, "2-D"),
    (lambda qw: opforge.linear(torch.randn(2, K), "w"), TypeError, "QuantizedWeight"),
    (lambda qw: opforge.linear(torch.randint(0, 3, (2, K)), qw), TypeError, "x must be"),
    (lambda qw: opforge.linear(torch.tensor(1.0), qw), ValueError, "0-d"),
    (lambda qw: opforge.linear(torch.randn(2, K, device="meta"), qw), ValueError, "w is on cpu but x is on meta"),
])
def test_bad_calls_raise_before_running(call, error, words):
    qw = opforge.quantize_weight(torch.randn(N, K), 4, 128)
    with opforge.trace() as t, pytest.raises(error) as info:
        call(qw)
    assert words in str(info.value) and len(t) == 0


def test_tile_configs_cover_both_paths():
    from opforge.ops.quant.problem import LinearProblem
    decode = qc.tile_config(LinearProblem(torch.bfloat16, 1, 4096, 4096, 4, 128, False, False, "cuda"))
    prefill = qc.tile_config(LinearProblem(torch.bfloat16, 4096, 4096, 4096, 4, 128, False, False, "cuda"))
    assert decode[3] is False and prefill[3] is True and prefill[0] == 128


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_verify_cases(backend):
    """The cases ``opforge verify`` runs pass on both backends (quick set)."""
    from opforge.testing import check_case
    from opforge.ops.quant.problem import prepare
    chosen = cases.verify_cases("cuda" if DEVICE == "cuda" else "cpu", quick=True)
    assert len(chosen) >= 10
    runs = [check_case(case, backend)[:2] for case in chosen]
    variants = {event.variant for event, _ in runs}
    dequant = any(prepare(args[0], args[1], args[2] if len(args) > 2 else None).problem.dequant_gemm
                  for _, args in runs)
    triton = {"decode", "prefill"} | ({"dequant_gemm"} if dequant else set())
    assert variants == (triton if backend == "triton" else {"reference"})


@pytest.mark.parametrize("bits, group_size, symmetric", [(4, 128, False), (8, 32, True), (4, -1, True)])
def test_triton_dequantize_is_exact(bits, group_size, symmetric):
    qw = opforge.quantize_weight(torch.randn(40, 256, device=DEVICE), bits, group_size, symmetric)
    assert torch.equal(tk.dequantize(qw, torch.float32), qw.dequantize())
    half = tk.dequantize(qw, torch.bfloat16)
    if DEVICE == "cuda":
        assert torch.equal(half, qw.dequantize(torch.bfloat16))
    else:   # the interpreter truncates to bf16 instead of rounding: within one bf16 step
        assert torch.allclose(half.float(), qw.dequantize(), rtol=2 ** -7, atol=0)


def test_dequant_gemm_variant_for_many_rows(monkeypatch):
    from opforge.ops.quant import problem
    monkeypatch.setattr(problem, "DEQUANT_GEMM_MIN_M", 70)   # int8: int4 takes it from 65 rows anyway
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE), 8, 128)
    x = torch.randn(75, K, device=DEVICE, dtype=torch.float16)
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    y, event = run_triton(x, qw, bias)
    assert event.variant == "dequant_gemm"
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.float16]
    y, event = run_triton(x[:69], qw, bias)
    assert event.variant == "prefill"


@pytest.mark.parametrize("m", [1, 4, 20])
def test_in_kernel_split_reduction_matches_the_combine_kernel(monkeypatch, m):
    """FIXUP (the last split of a tile adds the partials) gives the combine kernel's bits, and
    leaves the tile counters at zero for the next call."""
    from opforge.ops.quant import problem
    qw = opforge.quantize_weight(torch.randn(40, 2048, device=DEVICE), 4, 128)
    x = torch.randn(m, 2048, device=DEVICE, dtype=torch.float16)
    bias = torch.randn(40, device=DEVICE, dtype=torch.float16)
    call = problem.prepare(x, qw, bias)
    # one row: the GEMV tile with 128-code K steps, so that K=2048 splits (wide-K: test_wide_k_gemv_tiles)
    cfg = (1, 128, 128, False, 4, 3) if m == 1 else qc.tile_config(call.problem)
    assert qc._split(tk.cdiv(m, cfg[0]) * tk.cdiv(40, cfg[1]), 2048, cfg[2], x.device, qc.PROGRAMS_PER_SM)[0] > 1
    with opforge.runtime.alloc.poisoned_outputs():
        a = tk.launch_config(call, cfg, fixup=False)
        b = tk.launch_config(call, cfg, fixup=True)
        c = tk.launch_config(call, cfg, fixup=True)
    assert torch.equal(a, b) and torch.equal(b, c)
    assert rel_error(b, oracle(x, qw, bias)) < TOLERANCE[torch.float16]
    assert int(tk._counters(x.device, 1).abs().sum()) == 0


def test_empty_x_gives_an_empty_result():
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE), 4, 128)
    y = opforge.linear(torch.randn(0, 3, K, device=DEVICE, dtype=torch.float16), qw)
    assert y.shape == (0, 3, N) and y.dtype == torch.float16


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 128, False), (4, 32, True), (8, -1, False), (8, 64, True)])
@pytest.mark.parametrize("m,block_m", [(2, 2), (3, 4), (5, 8), (16, 16)])
def test_gemv_kernel_with_several_rows(bits, group_size, symmetric, m, block_m):
    """The FMA kernel with BLOCK_M rows of x (3-D tiles), K split across programs, ragged N and
    a bias, against the float64 oracle; the default config uses it up to GEMV_ROWS rows."""
    from opforge.ops.quant.problem import prepare
    n, k = 40, 1024
    qw = opforge.quantize_weight(torch.randn(n, k, device=DEVICE), bits, group_size, symmetric)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    call = prepare(x, qw, bias)
    y = tk.launch_config(call, (block_m, 32, 128, False, 4, 3), programs_per_sm=8)
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.bfloat16]
    uses_gemv = m <= qc.GEMV_ROWS and (bits == 4 or m <= 2)
    assert (qc.tile_config(call.problem)[3] is False) == uses_gemv


#: (bits, M) -> (BLOCK_N, BLOCK_K, use_dot, fixup) at N=40, K=2048, g128: the choices of the
#: H100 tile sweep at 980a81d (the default since 629522a). One row takes the wide-K tiles (test_wide_k_gemv_tiles).
CHOICES = {(4, 4): (128, 128, False, True), (8, 2): (64, 128, False, False),
           (4, 8): (64, 128, True, False), (4, 16): (64, 128, True, False), (8, 16): (64, 128, True, False),
           (4, 40): (64, 128, True, False), (8, 40): (64, 128, True, False)}


@pytest.mark.parametrize("bits,m", list(CHOICES))
def test_default_launch_choices_per_row_bucket(bits, m):
    """The launch choices per M bucket (the H100 sweep's tiles, the in-kernel split reduction for
    the int4 GEMV kernel, swapped dot tiles) run at a small shape with K split: against the
    float64 oracle, bitwise equal to the other split reduction, tile counters left at zero."""
    from opforge.ops.quant import problem
    block_n, block_k, use_dot, fixup = CHOICES[bits, m]
    n, k = 40, 2048
    qw = opforge.quantize_weight(torch.randn(n, k, device=DEVICE), bits, 128)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    call = problem.prepare(x, qw, bias)
    cfg = qc.tile_config(call.problem)
    assert cfg[1:4] == (block_n, block_k, use_dot) and qc.split_fixup(cfg, bits) is fixup
    assert qc._split(tk.cdiv(m, cfg[0]) * tk.cdiv(n, cfg[1]), k, cfg[2], x.device, qc.PROGRAMS_PER_SM)[0] > 1
    swap = use_dot and qc._swapped(call.problem)
    assert swap == use_dot      # the dot tiles up to 64 rows run swapped (weight as the MMA's A)
    with opforge.runtime.alloc.poisoned_outputs():
        y = tk.launch(call)
        other = tk.launch_config(call, cfg, fixup=not fixup, join=swap, swap=swap)
    assert torch.equal(y, other)
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.bfloat16]
    assert int(tk._counters(x.device, 1).abs().sum()) == 0
    y, event = run_triton(x, qw, bias)
    assert event.variant == expected_variant(m, bits, n, k)
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.bfloat16]


#: The tile_config of the first H100 measurements at N=K=4096 (g128 and per-row): the reference
#: the sweeps changed from.
EARLIER_TILES = {
    (4, 128, 1): (1, 128, 128, False, 4, 3), (4, 128, 3): (4, 128, 128, False, 4, 3),
    (4, 128, 5): (16, 64, 128, True, 4, 3), (4, 128, 16): (16, 64, 128, True, 4, 3),
    (4, 128, 17): (32, 64, 64, True, 4, 3), (4, 128, 33): (64, 64, 64, True, 4, 3),
    (4, 128, 64): (64, 64, 64, True, 4, 3), (4, 128, 65): (64, 128, 64, True, 4, 3),
    (4, 128, 256): (128, 128, 64, True, 8, 3), (4, -1, 16): (16, 64, 128, True, 4, 3),
    (4, -1, 64): (64, 64, 64, True, 4, 3), (8, 128, 2): (2, 64, 128, False, 4, 3),
    (8, 128, 3): (16, 64, 128, True, 4, 3), (8, 128, 64): (64, 64, 64, True, 4, 3),
}


def test_the_sweeps_changed_exactly_the_swept_choices():
    """Against the earlier tiles: one row takes the wide-K tiles, 3..64 rows (int4 past the GEMV's
    4) the swapped dot tiles, the in-kernel split reduction only for the int4 GEMV kernel,
    dequant+cuBLAS from 256 rows; N*K = 16Mi lies between the int4 17..64-row thresholds."""
    from opforge.ops.quant import problem
    from opforge.ops.quant.problem import LinearProblem

    def prob(bits, group, m):
        return LinearProblem(torch.bfloat16, m, 4096, 4096, bits, 4096 if group == -1 else group, False, False, "cuda")

    wide = {key for key in EARLIER_TILES if key[2] == 1}
    assert {key for key in wide if qc.tile_config(prob(*key)) == qc.wide_k_config(prob(*key))} == wide
    swapped = {key for key in EARLIER_TILES if qc._swapped(prob(*key))}
    assert swapped == {key for key in EARLIER_TILES if 3 <= key[2] <= 64 and not (key[0] == 4 and key[2] <= 4)}
    changed = {key for key in EARLIER_TILES if key not in wide and qc.tile_config(prob(*key)) != EARLIER_TILES[key]}
    assert changed == {(4, 128, 17), (4, 128, 33), (4, 128, 64), (4, -1, 64), (8, 128, 64)}
    assert [qc.split_fixup(EARLIER_TILES[key], key[0]) for key in ((4, 128, 1), (8, 128, 2), (4, 128, 16))] == \
        [True, False, False]
    assert problem.DEQUANT_GEMM_MIN_M == 256
    assert [prob(4, 128, m).large for m in (255, 256)] == [False, True]
    assert {key for key in EARLIER_TILES if prob(*key).dequant_gemm} == {(4, 128, 65), (4, 128, 256)}
    assert not any(qc._unswapped_join(prob(*key)) for key in EARLIER_TILES)


def _problem(m, n, k, bits=4, group=128):
    from opforge.ops.quant.problem import LinearProblem
    return LinearProblem(torch.bfloat16, m, n, k, bits, group, False, False, "cuda")


def test_small_int4_weights_at_17_to_64_rows_run_dequant_gemm():
    """Since fed7445: int4 with 16 < M <= 64 and N*K <= DEQUANT_SMALL_NK runs dequant+cuBLAS;
    not at M 16 or 65, one row of N past the threshold, 2048x8192, or int8."""
    from opforge.ops.quant import problem
    from opforge.runtime import registry
    assert problem.DEQUANT_SMALL_NK == 8 * 2 ** 20 and problem.DEQUANT_SMALL_MAX_M == 64
    shapes = ((2048, 2048), (3072, 2048), (4096, 2048), (4097, 2048), (2048, 8192))
    chosen = [(m, n, k) for m in (16, 17, 32, 64) for n, k in shapes if _problem(m, n, k).dequant_gemm]
    assert chosen == [(m, n, 2048) for m in (17, 32, 64) for n in (2048, 3072, 4096)]
    small, big, int8 = _problem(64, 2048, 2048), _problem(64, 4097, 2048), _problem(64, 2048, 2048, bits=8)
    assert tk.supports_dequant_gemm(small) is None
    assert "not int4 at M 17..64 with N*K <= 8388608" in tk.supports_dequant_gemm(big)
    assert not int8.dequant_gemm and tk.supports_dequant_gemm(int8) is not None
    with opforge.backend("triton"):
        assert registry.select("linear", small, "cuda").variant.name == "dequant_gemm"
        assert registry.select("linear", big, "cuda").variant.name == "prefill"


def test_large_int4_weights_at_33_to_64_rows_run_unswapped_joined_tiles():
    """Since fed7445: int4 with 32 < M <= 64 and N*K >= UNSWAPPED_JOIN_MIN_NK runs the dot kernel
    not swapped on (64, 128, BLOCK_K the group up to 128) tiles; M 32, N*K just below, int8 and
    M 65 keep their tiles."""
    assert qc.UNSWAPPED_JOIN_MIN_NK == 48 * 2 ** 20 == 24576 * 2048
    for m in (33, 40, 64):
        for n, k in ((128256, 2048), (28672, 4096), (4096, 14336), (24576, 2048)):
            p = _problem(m, n, k)
            assert qc.tile_config(p) == (64, 128, 128, True, 4, 3) and not qc._swapped(p) and not p.dequant_gemm
    assert qc.tile_config(_problem(64, 28672, 4096, group=64)) == (64, 128, 64, True, 4, 3)
    swapped = {(32, 28672, 4096, 4): (32, 64, 128, True, 4, 3), (64, 24575, 2048, 4): (64, 64, 128, True, 4, 3),
               (64, 16384, 2048, 4): (64, 64, 128, True, 4, 3), (64, 28672, 4096, 8): (64, 64, 128, True, 4, 3)}
    for (m, n, k, bits), tiles in swapped.items():
        assert qc._swapped(_problem(m, n, k, bits)) and qc.tile_config(_problem(m, n, k, bits)) == tiles
    p, past = _problem(64, 28672, 4096), _problem(65, 28672, 4096)
    assert qc.tile_config(past) == (64, 128, 64, True, 4, 3) and not qc._swapped(past)   # the M > 64 tiles
    assert qc._unswapped_join(p)


def test_launch_runs_the_unswapped_tiles_with_join(monkeypatch):
    """``launch`` passes join=True with the unswapped int4 tiles (threshold lowered to this small
    weight), and the result is the weight's."""
    from opforge.ops.quant import problem
    monkeypatch.setattr(qc, "UNSWAPPED_JOIN_MIN_NK", N * K)
    seen = []
    real = tk.launch_config

    def spy(call, config, *args, **kwargs):
        seen.append((config, kwargs["join"], kwargs["swap"]))
        return real(call, config, *args, **kwargs)

    monkeypatch.setattr(tk, "launch_config", spy)
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE), 4, 128)
    x = torch.randn(40, K, device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(N, device=DEVICE, dtype=torch.bfloat16)
    with opforge.runtime.alloc.poisoned_outputs():
        y = tk.launch(problem.prepare(x, qw, bias))
    assert seen == [((64, 128, 128, True, 4, 3), True, False)]
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.bfloat16]


def test_empty_inner_dimension_gives_the_bias_like_f_linear():
    x, w, b = torch.randn(3, 0), torch.randn(4, 0), torch.randn(4)
    torch.testing.assert_close(opforge.linear(x, w), F.linear(x, w))
    torch.testing.assert_close(opforge.linear(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 128, False), (4, -1, True), (8, -1, True), (8, 128, False)])
@pytest.mark.parametrize("k", [512, 4096])
def test_wide_k_gemv_tiles(bits, group_size, symmetric, k):
    """Wide-K tiles: one row of x on K tiles of up to 2048 (int4) / 1024 (int8) codes, the whole of K
    in one or two steps (split in two at K=4096 here: the fixup for int4, the combine for int8),
    ragged N, a bias; against the float64 oracle."""
    from opforge.ops.quant.problem import prepare
    n = 12
    qw = opforge.quantize_weight(torch.randn(n, k, device=DEVICE), bits, group_size, symmetric)
    x = torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    cfg = qc.tile_config(prepare(x, qw, bias).problem)
    assert cfg == qc.wide_k_config(prepare(x, qw, bias).problem) and cfg[2] == min(k, 2048 if bits == 4 else 1024)
    y, event = run_triton(x, qw, bias)
    assert event.variant == "decode"
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.bfloat16]


def test_wide_k_config_leaves_groups_that_do_not_divide_the_tile():
    from opforge.ops.quant.problem import LinearProblem
    assert qc.wide_k_config(LinearProblem(torch.bfloat16, 1, 64, 384, 4, 96, False, False, "cuda")) is None
    assert qc.wide_k_config(LinearProblem(torch.bfloat16, 1, 64, 8192, 8, -1, True, False, "cuda")) == \
        (1, 8, 1024, False, 4, 1)


@pytest.mark.parametrize("join,swap", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("bits,group_size,symmetric,dtype", [(4, 128, False, torch.bfloat16), (4, 32, True, torch.float16),
                                                             (8, 64, False, torch.bfloat16)])
@pytest.mark.parametrize("m,block_m,block_n", [(5, 16, 32), (16, 16, 32), (33, 32, 32), (40, 64, 128), (64, 64, 128)])
def test_dot_kernel_joined_and_swapped_forms(join, swap, bits, group_size, symmetric, dtype, m, block_m, block_n):
    """The dot kernel's JOIN form (int4: codes unpacked through tl.join; int8 ignores it)
    and SWAP form (the weight as the MMA's first operand), with K split at the smaller M and a ragged N,
    against the float64 oracle; M 40 and 64 on the (64, 128) tiles that int4 runs not swapped,
    joined, at M 33..64 on large weights (``UNSWAPPED_JOIN_MIN_NK``)."""
    from opforge.ops.quant.problem import prepare
    n, k = 40, 1024
    qw = opforge.quantize_weight(torch.randn(n, k, device=DEVICE), bits, group_size, symmetric)
    x = torch.randn(m, k, device=DEVICE, dtype=dtype)
    bias = torch.randn(n, device=DEVICE, dtype=dtype)
    call = prepare(x, qw, bias)
    with opforge.runtime.alloc.poisoned_outputs():
        y = tk.launch_config(call, (block_m, block_n, min(group_size, 128), True, 4, 3), programs_per_sm=8,
                             join=join, swap=swap)
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[dtype]


def test_int4_from_65_rows_runs_dequant_gemm_but_wide_short_weights_to_128():
    """int4 from M = 65 rows (below DEQUANT_GEMM_MIN_M) runs dequant+cuBLAS, except weights with
    N >= 16384 and K <= 2048 up to 128 rows (the Triton GEMM was faster there); int8 keeps its GEMM."""
    from opforge.ops.quant import problem
    from opforge.runtime import registry
    assert (problem.INT4_DEQUANT_MIN_M, problem.INT4_WIDE_N, problem.INT4_WIDE_MAX_K, problem.INT4_WIDE_MAX_M) == \
        (65, 16384, 2048, 128)
    shapes = ((2048, 8192), (4096, 4096), (28672, 4096), (4096, 14336), (16384, 2048), (128256, 2048), (16383, 2048))
    chosen = {(m, n, k) for m in (64, 65, 128, 129, 255) for n, k in shapes if _problem(m, n, k).mid_int4}
    wide = {(16384, 2048), (128256, 2048)}
    assert chosen == {(m, n, k) for m in (65, 128, 129, 255) for n, k in shapes if (n, k) not in wide or m > 128}
    assert not _problem(128, 4096, 4096, bits=8).dequant_gemm
    reason = tk.supports_dequant_gemm(_problem(100, 16384, 2048))
    assert "nor int4 from M=65 (but N >= 16384 with K <= 2048 only from M=129)" in reason
    with opforge.backend("triton"):
        assert registry.select("linear", _problem(100, 4096, 4096), "cuda").variant.name == "dequant_gemm"
        assert registry.select("linear", _problem(100, 16384, 2048), "cuda").variant.name == "prefill"
        assert registry.select("linear", _problem(129, 16384, 2048), "cuda").variant.name == "dequant_gemm"


@pytest.mark.parametrize("m", [65, 130])
def test_int4_dequant_gemm_from_65_rows_matches_the_weight(m):
    qw = opforge.quantize_weight(torch.randn(N, K, device=DEVICE) * 0.05, 4, 128)
    x = torch.randn(m, K, device=DEVICE, dtype=torch.float16)
    y, event = run_triton(x, qw)
    assert event.variant == "dequant_gemm"
    assert rel_error(y, oracle(x, qw)) < TOLERANCE[torch.float16]
