"""The planes layout of int4 weights (``repack``) and the Triton ``planes`` variant that reads it:
the layout round-trips, the kernel computes what the weight holds (float64 oracle), only a
repacked weight selects it, and what does not fit is refused naming the reason."""
import pytest
import torch

import opforge
from opforge.ops.quant import cases, metal, planes, planes_tiles as pt, repack, triton_kernels as tk
from opforge.ops.quant.problem import LinearProblem, prepare
from opforge.ops.quant.weight import LAYOUTS, QuantizedWeight, pack_codes, pack_planes, unpack_planes
from opforge.testing import DEVICE, TOLERANCE, rel_error


def oracle(x, qw, bias=None):
    return cases.oracle((x, qw, bias), {})


def planes_weight(n, k, group_size=128, symmetric=False, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    qw = opforge.quantize_weight(torch.randn(n, k, generator=gen).mul_(0.05).to(device), 4, group_size, symmetric)
    return qw, repack(qw, "planes")


def run_planes(x, pw, bias=None):
    with opforge.backend("triton"), opforge.trace() as t:
        y = opforge.linear(x, pw, bias)
    assert [(e.backend, e.variant) for e in t] == [("triton", "planes")]
    return y


def test_planes_words_hold_column_16i_plus_c_at_nibble_i():
    codes = torch.randint(0, 16, (3, 384))
    packed = pack_planes(codes)
    for q, i, c in [(0, 0, 0), (0, 7, 15), (1, 3, 9), (2, 5, 2)]:
        word = int(packed[1, 16 * q + c]) & 0xFFFFFFFF
        assert (word >> (4 * i)) & 0xF == codes[1, 128 * q + 16 * i + c]
    assert torch.equal(unpack_planes(packed), codes.int())


@pytest.mark.parametrize("group_size, symmetric", [(128, False), (32, True), (-1, False)])
def test_repack_keeps_the_weight_and_round_trips(group_size, symmetric):
    qw, pw = planes_weight(16, 256, group_size, symmetric)
    assert pw.layout == "planes" and qw.layout == "rows" and "layout=planes" in repr(pw)
    assert not torch.equal(pw.packed, qw.packed)
    assert torch.equal(pw.codes(), qw.codes()) and torch.equal(pw.dequantize(), qw.dequantize())
    back = repack(pw, "rows")
    assert back.layout == "rows" and torch.equal(back.packed, qw.packed)
    assert repack(pw, "planes") is pw


@pytest.mark.parametrize("symmetric, scale_dtype", [(False, torch.float16), (True, torch.bfloat16)])
def test_group_words_carry_each_scale_and_zero_exactly(symmetric, scale_dtype):
    """The planes kernel's one word per group and row: the float32 scale's bits OR the zero."""
    codes = torch.randint(0, 16, (8, 256))
    scales = (torch.rand(8, 2) * 0.1 + 1e-3).to(scale_dtype)
    zeros = None if symmetric else torch.randint(0, 16, (8, 2)).to(scale_dtype)
    pw = repack(QuantizedWeight.from_codes(codes, scales, zeros, 4, 128), "planes")
    words = pw.group_words
    assert words.dtype == torch.int32 and words.shape == (2, 8)
    assert torch.equal((words & ~15).view(torch.float32), scales.t().float())
    want = torch.full((2, 8), 8) if symmetric else zeros.t().int()
    assert torch.equal(words & 15, want.int())
    assert QuantizedWeight.from_codes(codes, scales, zeros, 4, 128).group_words is None
    assert pw.nbytes == QuantizedWeight.from_codes(codes, scales, zeros, 4, 128).nbytes + words.numel() * 4


def test_state_dict_round_trips_the_layout_and_old_dicts_load_as_rows():
    qw, pw = planes_weight(8, 128, device="cpu")
    d = pw.state_dict()
    assert d["layout"] == LAYOUTS.index("planes") and "layout" not in qw.state_dict()
    d = {k: torch.tensor(v) if isinstance(v, int) else v for k, v in d.items()}   # as safetensors returns ints
    again = QuantizedWeight.from_state_dict(d)
    assert again.layout == "planes" and torch.equal(again.packed, pw.packed)
    assert torch.equal(again.dequantize(), qw.dequantize())
    old = QuantizedWeight.from_state_dict(qw.state_dict())
    assert old.layout == "rows" and torch.equal(old.dequantize(), qw.dequantize())
    with pytest.raises(ValueError, match="layout must be an index"):
        QuantizedWeight.from_state_dict(dict(qw.state_dict(), layout=7))


def test_safetensors_save_and_load_keep_the_layout(tmp_path):
    qw, pw = planes_weight(16, 256, device="cpu")
    path = tmp_path / "w.safetensors"
    opforge.save_safetensors({"planes": pw, "rows": qw}, path)
    back = opforge.load_safetensors(path)
    assert back["planes"].layout == "planes" and back["rows"].layout == "rows"
    assert torch.equal(back["planes"].packed, pw.packed) and torch.equal(back["planes"].group_words, pw.group_words)
    assert torch.equal(back["planes"].dequantize(), qw.dequantize())


def test_row_operations_keep_the_layout():
    qw, pw = planes_weight(6, 256, device="cpu")
    picked = pw.select_rows(torch.tensor([4, 1]))
    assert picked.layout == "planes" and torch.equal(picked.dequantize(), qw.dequantize()[[4, 1]])
    assert torch.equal(picked.group_words, pw.group_words[:, [4, 1]])
    both = QuantizedWeight.concat([pw, pw])
    assert both.layout == "planes" and torch.equal(both.dequantize(), torch.cat([qw.dequantize()] * 2))
    mixed = QuantizedWeight.concat([pw, qw])             # one layout each: rebuilt from the codes
    assert mixed.layout == "rows" and torch.equal(mixed.dequantize(), torch.cat([qw.dequantize()] * 2))
    assert pw.to(pw.device).layout == "planes"


@pytest.mark.parametrize("make, words", [
    (lambda: repack(opforge.quantize_weight(torch.randn(4, 256), 8, 128), "planes"), "int4 weights with K a multiple"),
    (lambda: repack(opforge.quantize_weight(torch.randn(4, 64), 4, 32), "planes"), "K=64"),
    (lambda: repack(opforge.quantize_weight(torch.randn(4, 256), 4, 128), "tiles"), "layout must be one of"),
    (lambda: repack(torch.randn(4, 256), "planes"), "must be a QuantizedWeight"),
    (lambda: repack(QuantizedWeight.from_codes(torch.randint(0, 16, (4, 128)), torch.rand(4, 1).half() + 0.1,
                                               torch.full((4, 1), 7.5).half(), 4, 128), "planes"), "integer zeros"),
    (lambda: repack(QuantizedWeight.from_codes(torch.randint(0, 16, (4, 128)), torch.rand(4, 1) + 0.1,
                                               None, 4, 128), "planes"), "float16 or bfloat16 scales"),
])
def test_repack_refuses_what_the_layout_cannot_hold(make, words):
    with pytest.raises((ValueError, TypeError), match=words):
        make()


@pytest.mark.parametrize("m, group_size, symmetric, dtype", [
    (1, 128, False, torch.float16), (2, 128, True, torch.bfloat16), (5, 32, False, torch.float16),
    (16, 64, True, torch.float16), (16, -1, False, torch.bfloat16), (33, 128, False, torch.float16),
    (64, 32, True, torch.bfloat16), (70, 128, False, torch.float16)])
def test_planes_kernel_matches_the_weight_it_holds(m, group_size, symmetric, dtype):
    """Every BLOCK_M (16, 32, 64, several M tiles), groups smaller than, equal to and larger than
    the 128-code chunk, both zero kinds, both dtypes (the interpreter runs the MMA in float32);
    also where the GEMV kernel (one row) or dequant+cuBLAS (small weights from 65 rows) runs by
    default."""
    qw, pw = planes_weight(96, 256, group_size, symmetric, seed=m)
    x = torch.randn(m, 256, device=DEVICE, dtype=dtype)
    call = prepare(x, pw, None)
    y = planes.launch_planes(call)
    assert y.shape == (m, 96) and y.dtype == dtype
    assert rel_error(y, oracle(x, qw)) < TOLERANCE[dtype]
    by_default = planes.supports_planes(call.problem) is None
    small = 96 * 256 <= pt.PLANES_SMALL_MAX_NK
    assert by_default == (m > 1 and not (m >= pt.PLANES_DEQUANT_SMALL_MIN_M and small))
    if by_default:
        assert rel_error(run_planes(x, pw), oracle(x, qw)) < TOLERANCE[dtype]


@pytest.mark.parametrize("m, k, group_size, symmetric, variant", [
    (1, 2048, 128, False, "decode"), (1, 384, -1, True, "decode"), (3, 256, 128, True, "planes"),
    (2, 512, 128, False, "planes"), (1, 256, 64, False, "planes"), (3, 256, 32, True, "planes"),
    (5, 256, 128, False, "planes")])
def test_the_gemv_kernel_reads_the_planes_layout_at_one_row(m, k, group_size, symmetric, variant):
    """One row with groups of >= 128: the decode variant's GEMV (wide-K tiles) reads the planes
    layout (x's columns by ``_code_columns``); smaller groups or more rows run planes."""
    qw, pw = planes_weight(72, k, group_size, symmetric, seed=k + m)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.float16)
    bias = torch.randn(72, device=DEVICE, dtype=torch.float16)
    with opforge.backend("triton"), opforge.trace() as t:
        y = opforge.linear(x, pw, bias)
    assert [(e.backend, e.variant) for e in t] == [("triton", variant)]
    assert rel_error(y, oracle(x, qw, bias)) < TOLERANCE[torch.float16]


def test_a_planes_weight_runs_the_gemv_kernel_only_with_whole_chunks():
    _, pw = planes_weight(64, 256, 128)
    call = prepare(torch.randn(2, 256, device=DEVICE, dtype=torch.float16), pw, None)
    for config in [(2, 64, 64, False, 4, 1), (16, 64, 128, True, 4, 3)]:
        with pytest.raises(ValueError, match="planes-layout weight runs here only in the GEMV"):
            tk.launch_config(call, config)


@pytest.mark.parametrize("fixup", [False, True])
def test_split_k_bias_and_strided_rows(fixup):
    """K split across programs (the partials added by the combine kernel or in the kernel),
    a bias, rows of x read in place from a wider tensor."""
    qw, pw = planes_weight(64, 1024, 128, False, seed=3)
    big = torch.randn(6, 1100, device=DEVICE, dtype=torch.float16)
    x = big[:, 5:5 + 1024]
    bias = torch.randn(64, device=DEVICE, dtype=torch.float16)
    call = prepare(x, pw, bias)
    out = planes.launch_planes(call, programs_per_sm=4, fixup=fixup)
    assert rel_error(out, oracle(x, qw, bias)) < TOLERANCE[torch.float16]
    y = run_planes(x.reshape(2, 3, 1024), pw, bias)
    assert y.shape == (2, 3, 64) and rel_error(y.reshape(6, 64), oracle(x, qw, bias)) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("k, group_size, chunks, ahead", [
    (512, 128, 2, False), (512, 128, 2, True), (384, 128, 2, True), (512, 32, 2, True), (640, -1, 2, True),
    (384, 64, 1, True)])
def test_chunks_per_step_and_scales_ahead_across_splits(k, group_size, chunks, ahead):
    """Two chunks per loop step (an odd chunk count steps one at a time), each group's scale
    loaded a chunk early (only with one group per chunk), over K splits of several chunks each."""
    qw, pw = planes_weight(80, k, group_size, seed=k + chunks)
    x = torch.randn(16, k, device=DEVICE, dtype=torch.bfloat16)
    call = prepare(x, pw, None)
    for pps in (4, 64):     # one split per tile, and K split as far as the tiles allow
        out = planes.launch_planes(call, (16, 64, 2, 3, pps, chunks, ahead))
        assert rel_error(out, oracle(x, qw)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("m, config", [
    (20, (64,) + pt.PLANES_TILE_LARGE), (32, (16,) + pt.PLANES_TILE_WIDE), (45, (32,) + pt.PLANES_TILE_WIDE_FOLDED),
    (64, (16,) + pt.PLANES_TILE_TWO_WARPS), (40, (64,) + pt.PLANES_TILE_EIGHT_WARPS), (7, (16,) + pt.PLANES_TILE_FEW_ROWS),
    (1, (16,) + pt.PLANES_TILE_FEW_ROWS), (1, (16,) + pt.PLANES_TILE_TWO_WARPS)])
def test_tiles_of_other_rows_than_m(m, config):
    """The tiles the rules pick: one tile with padded rows (one row: the kernel's copy with M not
    specialized), several M tiles side by side (a partial last one), each against float64."""
    qw, pw = planes_weight(300, 512, 128, seed=m)
    x = torch.randn(m, 512, device=DEVICE, dtype=torch.bfloat16)
    out = planes.launch_planes(prepare(x, pw, None), config)
    assert out.shape == (m, 300) and rel_error(out, oracle(x, qw)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("group_size, symmetric, dtype", [
    (128, False, torch.bfloat16), (128, True, torch.float16), (-1, False, torch.float16),
    (64, True, torch.bfloat16), (32, False, torch.float16)])
@pytest.mark.parametrize("k128, fold", [(True, False), (True, True), (False, True)])
def test_one_k128_dot_per_chunk_and_the_folded_scale(group_size, symmetric, dtype, k128, fold):
    """A chunk as one K = 128 dot, with and without the scale folded into the codes, over K
    splits, two chunks per step and scales ahead; groups under 128 codes run per plane (the
    fold only comes with the K = 128 dot), both zero kinds, both dtypes."""
    qw, pw = planes_weight(80, 1024, group_size, symmetric, seed=group_size + 3 * fold)
    x = torch.randn(24, 1024, device=DEVICE, dtype=dtype)
    want = oracle(x, qw)
    call = prepare(x, pw, None)
    for config in [(32, 64, 4, 4, 64, 1, False, k128, fold), (16, 64, 2, 3, 4, 2, True, k128, fold)]:
        out = planes.launch_planes(call, config)
        assert rel_error(out, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("m, config", [
    (1, (16,) + pt.PLANES_TILE_TWO_WARPS), (16, (16,) + pt.PLANES_TILE_TWO_WARPS),
    (20, (32,) + pt.PLANES_TILE_FOUR_WARPS_UNSPLIT), (24, (32,) + pt.PLANES_TILE_FOUR_WARPS),
    (40, (64,) + pt.PLANES_TILE_LARGE), (100, (64,) + pt.PLANES_TILE_LARGE), (5, (16,) + pt.PLANES_TILE_FEW_ROWS),
    (12, (16,) + pt.PLANES_TILE_WIDE), (30, (32,) + pt.PLANES_TILE_WIDE_PER_PLANE)])
def test_codes_and_x_through_tensor_descriptors_give_the_pointer_forms_bits(m, config):
    """The codes (and, with the K = 128 dot, x) read through tensor descriptors: the copy engine's
    zeros past the last row (N = 300 is no multiple of the tiles, M no multiple of BLOCK_M) and past
    x's rows change nothing; the same MMAs on the same values give the pointer loads' bits."""
    qw, pw = planes_weight(300, 1024, 128, seed=m)
    x = torch.randn(m, 1024, device=DEVICE, dtype=torch.bfloat16)
    call = prepare(x, pw, None)
    by_pointers = planes.launch_planes(call, config, tma=False, x_tma=False)
    assert rel_error(by_pointers, oracle(x, qw)) < TOLERANCE[torch.bfloat16]
    for x_tma in (False, True):
        assert torch.equal(planes.launch_planes(call, config, tma=True, x_tma=x_tma), by_pointers), x_tma


def test_x_with_rows_no_descriptor_can_address_is_read_by_pointers():
    """x's rows 2 bytes off 16-byte alignment (a slice of a wider tensor): no descriptor for x, the
    codes still through theirs, the result the pointer loads' bits."""
    qw, pw = planes_weight(128, 512, 128, seed=5)
    x = torch.randn(16, 520, device=DEVICE, dtype=torch.bfloat16)[:, 1:513]
    call = prepare(x, pw, None)
    config = (16,) + pt.PLANES_TILE_TWO_WARPS
    assert not planes._descriptor_ok(x)
    assert torch.equal(planes.launch_planes(call, config, tma=True, x_tma=True),
                       planes.launch_planes(call, config, tma=False, x_tma=False))


def test_tensor_descriptors_by_default_only_where_they_measured_faster():
    """Off the GPU never; the rule: heads from 9 rows, 8B-gate_up-sized weights at 9-32 rows, the
    other 48M+ weights (K split) at 17-64 rows, nothing under 48M elements or under 9 rows."""
    def tma(m, n, k, device="cuda"):
        return pt.planes_tma(LinearProblem(torch.bfloat16, m, n, k, 4, 128, False, False, device, "planes"))[0]
    assert [m for m in (1, 8, 9, 16, 32, 64, 128, 255) if tma(m, 128256, 2048)] == [9, 16, 32, 64, 128, 255]
    assert [m for m in (1, 8, 9, 16, 32, 33, 64) if tma(m, 28672, 4096)] == [9, 16, 32]
    assert [m for m in (8, 16, 17, 32, 64, 65, 128) if tma(m, 4096, 14336)] == [17, 32, 64]
    assert not any(tma(m, n, k) for m in (1, 16, 32, 64) for n, k in [(16384, 2048), (6144, 4096), (2048, 8192)])
    problem = LinearProblem(torch.bfloat16, 16, 28672, 4096, 4, 128, False, False, DEVICE, "planes")
    x = torch.zeros(16, 4096, device=DEVICE)
    if DEVICE == "cpu":
        assert planes.tma_forms(problem, x) == (False, False)


def test_the_rules_pick_the_k128_dot_and_fold_on_two_tiles():
    """K = 128 dots from 1 row (not on the middle weights from 65 rows), the fold only on the
    large and two-32-row tiles from 33 rows; one row takes the tiles of 2-8 rows, except with
    K >= 4096 under 48M elements (one warpgroup on 128 features)."""
    def tiles(m, n, k):
        return pt.planes_config(LinearProblem(torch.bfloat16, m, n, k, 4, 128, False, False, "cuda", "planes"))
    shapes = [(3072, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (6144, 4096), (28672, 4096), (4096, 14336)]
    for m in (1, 2, 8, 9, 16, 17, 32, 33, 64, 128):
        for n, k in shapes:
            config = tiles(m, n, k)
            per_plane = m > 64 and pt.PLANES_SMALL_MAX_NK < n * k <= pt.PLANES_MIDDLE_MAX_NK
            assert config[7] != per_plane, (m, n, k)
            folded = config[1:] in (pt.PLANES_TILE_LARGE, pt.PLANES_TILE_WIDE_FOLDED)
            assert config[8] == folded and (not folded or m > 32), (m, n, k)
    wide = {(n, k) for n, k in shapes if k >= pt.PLANES_WIDE_MIN_K and n * k < pt.PLANES_LARGE_MIN_NK}
    assert wide == {(6144, 4096), (2048, 8192)}
    assert all(tiles(1, n, k) == tiles(2, n, k) for n, k in shapes if (n, k) not in wide)
    assert all(tiles(1, n, k) == (16,) + pt.PLANES_TILE_ONE_ROW_WIDE for n, k in wide)
    assert tiles(128, 4096, 4096)[1:] == pt.PLANES_TILE_WIDE_PER_PLANE


def test_wide_weights_split_no_k_at_9_to_32_rows():
    """From 16384 features the four-warp tiles (9-32 rows) aim at one program per SM, which their
    256+ tiles already give on an H100 (132 SMs): K is not split, no combine kernel runs. Narrower
    weights keep 4 programs per SM (1B qkv at 32 rows: 48 tiles, K split)."""
    def tiles(m, n, k):
        return pt.planes_config(LinearProblem(torch.bfloat16, m, n, k, 4, 128, False, False, "cuda", "planes"))
    for m in (9, 16, 17, 32):
        config = tiles(m, 16384, 2048)
        assert config[1:] == pt.PLANES_TILE_FOUR_WARPS_UNSPLIT, m
        assert 16384 // config[1] >= config[4] * 132
        config = tiles(m, 3072, 2048)
        assert config[1:] == pt.PLANES_TILE_FOUR_WARPS and 3072 // config[1] < config[4] * 132, m


def test_only_a_repacked_weight_selects_planes_and_it_selects_nothing_else():
    qw, pw = planes_weight(64, 256)
    x = torch.randn(16, 256, device=DEVICE, dtype=torch.float16)
    with opforge.backend("triton"):
        text = str(opforge.explain("linear", x, pw))
        rows_text = str(opforge.explain("linear", x, qw))
    assert "chosen: triton.planes" in text
    problem = prepare(x, pw, None).problem
    for supports in (tk.supports_decode, tk.supports_prefill, tk.supports_dequant_gemm):
        assert "the weight is in the planes layout" in supports(problem)
    many = LinearProblem(torch.float16, 300, 4096, 4096, 4, 128, False, False, "cuda", "planes")
    assert tk.supports_dequant_gemm(many) is None and "dequant+cuBLAS" in planes.supports_planes(many)
    assert "planes layout" in tk.supports_prefill(many)
    few = prepare(x[:1], pw, None).problem
    assert tk.supports_decode(few) is None and "GEMV reads the planes layout" in planes.supports_planes(few)
    head = LinearProblem(torch.float16, 1, 8192, 2048, 4, 128, False, False, "cuda", "planes")   # 16M elements
    assert planes.supports_planes(head) is None and f"N*K < {2 ** 24}" in tk.supports_decode(head)
    below = LinearProblem(torch.float16, 1, 8191, 2048, 4, 128, False, False, "cuda", "planes")
    assert tk.supports_decode(below) is None and "GEMV reads the planes layout" in planes.supports_planes(below)
    assert "chosen: triton.decode" in rows_text and "not triton.planes: the weight is in the rows layout" in rows_text
    with opforge.backend("torch"), opforge.trace() as t:      # the torch path reads either layout
        y = opforge.linear(x, pw)
    assert t[0].variant == "reference" and rel_error(y, oracle(x, qw)) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("group_size, symmetric", [(128, False), (32, True), (-1, False)])
def test_dequantize_kernel_reads_the_planes_layout(group_size, symmetric):
    """dequant+cuBLAS (M >= DEQUANT_GEMM_MIN_M) with a planes weight: the Triton dequantize
    kernel writes exactly the weight the rows layout gives."""
    qw, pw = planes_weight(40, 384, group_size, symmetric)
    assert torch.equal(tk.dequantize(pw, torch.float16), tk.dequantize(qw, torch.float16))
    assert torch.equal(tk.dequantize(pw, torch.float32), qw.dequantize())
    x = torch.randn(300, 384, device=DEVICE, dtype=torch.float16)
    with opforge.backend("triton"), opforge.trace() as t:
        y = opforge.linear(x, pw)
    assert t[0].variant == "dequant_gemm" and rel_error(y, oracle(x, qw)) < TOLERANCE[torch.float16]


def test_float32_x_and_metal_refuse_the_planes_layout():
    problem = LinearProblem(torch.float32, 16, 64, 256, 4, 128, False, False, "cuda", "planes")
    assert "float16 or bfloat16" in planes.supports_planes(problem)
    mps = LinearProblem(torch.float16, 16, 64, 256, 4, 128, False, False, "mps", "planes")
    assert "planes layout" in metal.supports_qmv(mps) and "planes layout" in metal.supports_qmm(mps)
    _, pw = planes_weight(64, 256)
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="float16 or bfloat16"):
        opforge.linear(torch.randn(2, 256, device=DEVICE), pw)


def test_pack_codes_and_pack_planes_agree_on_the_codes():
    codes = torch.randint(0, 16, (5, 256))
    assert torch.equal(unpack_planes(pack_planes(codes)),
                       QuantizedWeight(pack_codes(codes, 4), torch.ones(2, 5), None, 4, 128, (5, 256)).codes())


def test_torch_compile_carries_the_layout_through_the_custom_op():
    """Compiling, a QuantizedWeight travels as plain tensors and ints (``fakes``): the layout
    too, else the planes words would be read as rows."""
    qw, pw = planes_weight(24, 256, device="cpu")
    x = torch.randn(3, 256)
    f = torch.compile(lambda h: opforge.linear(h, pw), fullgraph=True, backend="aot_eager")
    assert rel_error(f(x), oracle(x, qw)) < TOLERANCE[torch.float32]


def test_quant_linear_refuses_a_planes_weight():
    import opforge
    from opforge.ops.quant import repack
    w = opforge.quantize_weight(torch.randn(16, 256), 4, 128)
    with pytest.raises(ValueError, match="rows-layout"):
        opforge.nn.QuantLinear(repack(w, "planes"))
    assert opforge.nn.QuantLinear(w).weight.layout == "rows"


def test_preferred_layout_is_planes_for_int4_on_cuda_where_it_fits():
    """What the model loader repacks to: planes for int4 on CUDA with groups of >= 128 (or one per
    row) that the layout can hold; rows elsewhere and for anything else."""
    w = torch.randn(8, 256)
    g128, per_row = opforge.quantize_weight(w, 4, 128), opforge.quantize_weight(w, 4, -1)
    assert [opforge.preferred_layout(q, "cuda") for q in (g128, per_row)] == ["planes", "planes"]
    assert opforge.preferred_layout(g128, "cpu") == "rows" and opforge.preferred_layout(g128, "mps") == "rows"
    fp32_scales = QuantizedWeight.from_codes(torch.randint(0, 16, (4, 128)), torch.rand(4, 1) + 0.1, None, 4, 128)
    half_zeros = QuantizedWeight.from_codes(torch.randint(0, 16, (4, 128)), torch.rand(4, 1).half() + 0.1,
                                            torch.full((4, 1), 7.5).half(), 4, 128)
    for other in (opforge.quantize_weight(w, 4, 32), opforge.quantize_weight(w, 8, 128), fp32_scales, half_zeros):
        assert opforge.preferred_layout(other, "cuda") == "rows"


_PREFETCH_PTX = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from opforge.ops.quant.planes import _planes_kernel as kernel
pointers = {"x_ptr": "*bf16", "w_ptr": "*i32", "gw_ptr": "*i32", "b_ptr": "*bf16", "out_ptr": "*bf16",
            "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
out = {}
for pf in (0, 4):
    consts = {"GROUP": 128, "PER_ROW": False, "HAS_BIAS": False, "PARTIAL": False, "FIXUP": False, "F32_DOT": False,
              "CODE_MODE": 1, "BLOCK_M": 16, "BLOCK_N": 64, "ASM": True, "PDL": True, "CHUNKS": 2,
              "SCALE_AHEAD": False, "K128": True, "FOLD": False, "PF_LINES": pf, "TMA": False,
              "X_TMA": False}
    sig = {a: pointers.get(a, "constexpr" if a in consts else "i32") for a in kernel.arg_names}
    ptx = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 2, "num_stages": 3}).asm["ptx"]
    body = ptx[ptx.index(".entry"):]
    out[pf] = [body.count("prefetch.global.L2"), body.find("prefetch.global.L2"), body.find("griddepcontrol.wait")]
print(json.dumps(out))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="offline sm_90 compile check, for machines without a GPU")
def test_the_planes_kernel_prefetches_weight_lines_before_its_pdl_wait():
    """Compiled for sm_90 (Triton's real compiler, no GPU): with PF_LINES the kernel asks L2 for
    its rows' first lines (64 rows x 4 lines over 64 threads: 4 prefetches each) before
    ``griddepcontrol.wait``; without, none."""
    import json
    import os
    import subprocess
    import sys
    pytest.importorskip("triton.language.extra.cuda", reason="this Triton has no PDL (gdc_wait)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _PREFETCH_PTX], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["0"][0] == 0 and found["0"][2] >= 0
    count, first_prefetch, wait = found["4"]
    assert count == 4 and 0 <= first_prefetch < wait


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9),
                    reason="programmatic dependent launch needs an sm_90+ GPU")
@pytest.mark.parametrize("m", [1, 8])
def test_the_l2_prefetch_changes_no_bit(m, monkeypatch):
    """On a weight that prefetches (``PLANES_PREFETCH_MIN_NK`` elements) the result is the same
    bits with the prefetch as without, and matches the float64 oracle."""
    from opforge.ops.quant import config
    n, k = pt.PLANES_PREFETCH_MIN_NK // 4096, 4096
    qw, pw = planes_weight(n, k, device="cuda")
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    assert config.prefetch_lines(n // 64, x.device, 4, 64, k // 2) > 0
    with_prefetch = run_planes(x, pw)
    monkeypatch.setattr(config, "PREFETCH_BYTES", 0)
    without = run_planes(x, pw)
    assert torch.equal(with_prefetch, without)
    assert rel_error(with_prefetch, oracle(x, qw)) < TOLERANCE[torch.bfloat16]
