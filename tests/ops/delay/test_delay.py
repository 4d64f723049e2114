"""apply_delay / revert_delay on the triton (interpreter on CPU) and torch backends."""
import pytest
import torch

import opforge
from opforge.ops.delay import cases, problem, reference
from opforge.testing import DEVICE, check_case

BACKENDS = ["triton", "torch"]
CODE_DTYPES = (torch.int32, torch.int64)


def naive_apply(codes, delays, bos, pad):
    """The definition, element by element."""
    b, t, c = codes.shape
    out = torch.empty_like(codes)
    for ti in range(t):
        for ci in range(c):
            src = ti - delays[ci]
            out[:, ti, ci] = codes[:, src, ci] if 0 <= src < t else (bos if src < 0 else pad)
    return out


def naive_revert(codes, delays, pad):
    b, t, c = codes.shape
    out = torch.empty_like(codes)
    for ti in range(t):
        for ci in range(c):
            src = ti + delays[ci]
            out[:, ti, ci] = codes[:, src, ci] if src < t else pad
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", CODE_DTYPES)
@pytest.mark.parametrize("op", ["apply_delay", "revert_delay"])
@pytest.mark.parametrize("layout", ["packed", "strided"])
def test_matches_oracle(backend, dtype, op, layout):
    check_case(cases.make_case(op, (2, 21, 9), dtype, layout), backend)


def test_reference_matches_the_definition():
    codes = torch.randint(0, 1000, (2, 13, 5))
    d = [0, 1, 3, 12, 20]
    assert torch.equal(reference.apply_delay(codes, torch.tensor(d), -1, -2), naive_apply(codes, d, -1, -2))
    assert torch.equal(reference.revert_delay(codes, torch.tensor(d), -2), naive_revert(codes, d, -2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("c", [1, 9, 70])
def test_kernel_matches_the_definition_and_revert_recovers(backend, c):
    codes = torch.randint(0, 1000, (3, 19, c), dtype=torch.int64, device=DEVICE)
    d = [(5 * i) % 23 for i in range(c)]
    with opforge.backend(backend), opforge.trace() as t:
        delayed = opforge.apply_delay(codes, d, bos_id=-7, pad_id=-9)
        back = opforge.revert_delay(delayed, d, pad_id=-9)
    assert [e.backend for e in t] == [backend, backend]
    assert torch.equal(delayed.cpu(), naive_apply(codes.cpu(), d, -7, -9))
    survive = (torch.arange(19).view(19, 1) + torch.tensor(d).view(1, c)) < 19
    assert torch.equal(back.cpu()[:, survive], codes.cpu()[:, survive])
    assert torch.all(back.cpu()[:, ~survive] == -9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_and_device_tensor_delays(backend):
    codes = cases.random_codes((2, 15, 4), torch.int32, DEVICE, "strided")
    out = torch.full((2, 4, 15), 77, dtype=torch.int32, device=DEVICE).transpose(1, 2)   # strided out
    d = torch.tensor([3, 0, 2, 1], device=DEVICE)
    with opforge.backend(backend):
        res = opforge.apply_delay(codes, d, bos_id=2**31 - 1, pad_id=-2**31, out=out)
    assert res is out
    assert torch.equal(out.cpu(), naive_apply(codes.cpu(), d.tolist(), 2**31 - 1, -2**31))


def test_python_delays_are_cached_per_tuple():
    a = problem.delays_tensor((0, 1, 2), torch.device(DEVICE))
    assert problem.delays_tensor((0, 1, 2), torch.device(DEVICE)) is a
    assert problem.delays_tensor((0, 1, 3), torch.device(DEVICE)) is not a


def test_empty_inputs_give_empty_results():
    for shape in [(0, 5, 3), (2, 0, 3), (2, 5, 0)]:
        codes = torch.zeros(shape, dtype=torch.int64, device=DEVICE)
        with opforge.trace() as t:
            out = opforge.apply_delay(codes, [1] * shape[2], bos_id=1, pad_id=2)
            back = opforge.revert_delay(codes, [1] * shape[2], pad_id=2)
        assert out.shape == shape and back.shape == shape and len(t) == 0


def test_errors():
    codes = torch.zeros(2, 5, 3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="one entry per codebook \\(C=3\\), got 2"):
        opforge.apply_delay(codes, [0, 1], bos_id=1, pad_id=2)
    with pytest.raises(ValueError, match="shape \\(3,\\)"):
        opforge.revert_delay(codes, torch.tensor([0, 1]), pad_id=2)
    with pytest.raises(ValueError, match="delays must be >= 0, got delays\\[1\\] = -1"):
        opforge.apply_delay(codes, [0, -1, 0], bos_id=1, pad_id=2)
    with pytest.raises(ValueError, match="delays must be >= 0"):
        opforge.revert_delay(codes, torch.tensor([0, 0, -3]), pad_id=2)
    with pytest.raises(TypeError, match="codes must be int32 or int64"):
        opforge.apply_delay(codes.float(), [0, 1, 2], bos_id=1, pad_id=2)
    with pytest.raises(TypeError, match="codes must be int32 or int64"):
        opforge.apply_delay(codes.short(), [0, 1, 2], bos_id=1, pad_id=2)
    with pytest.raises(ValueError, match="bos_id=2147483648 does not fit"):
        opforge.apply_delay(codes, [0, 1, 2], bos_id=2**31, pad_id=2)
    with pytest.raises(ValueError, match="pad_id=-2147483649 does not fit"):
        opforge.revert_delay(codes, [0, 1, 2], pad_id=-2**31 - 1)
    with pytest.raises(TypeError, match="delays must be an integer tensor"):
        opforge.apply_delay(codes, torch.tensor([0.0, 1.0, 2.0]), bos_id=1, pad_id=2)
    with pytest.raises(TypeError, match="delays must be ints"):
        opforge.apply_delay(codes, [0, 1.5, 2], bos_id=1, pad_id=2)
    with pytest.raises(ValueError, match="codes must be \\(B, T, C\\)"):
        opforge.apply_delay(codes[0], [0, 1, 2], bos_id=1, pad_id=2)
    with pytest.raises(ValueError, match="out must be"):
        opforge.apply_delay(codes, [0, 1, 2], bos_id=1, pad_id=2, out=torch.empty(2, 5, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="out must not overlap codes"):
        opforge.apply_delay(codes, [0, 1, 2], bos_id=1, pad_id=2, out=codes)


def test_explain():
    codes = torch.zeros(2, 5, 3, dtype=torch.int64, device=DEVICE)
    text = str(opforge.explain("apply_delay", codes, [0, 1, 2], bos_id=1, pad_id=2))
    assert "codes int64 C=3" in text


def test_transformers_dia_helpers_agree():
    """Hugging Face's DiaProcessor builds index tensors on the host and gathers; same results."""
    processing = pytest.importorskip("transformers.models.dia.processing_dia")
    proc = processing.DiaProcessor
    codes = torch.randint(0, 1024, (2, 40, 9), dtype=torch.int64)
    d = cases.dia_delays(9)
    on_device = codes.to(DEVICE)   # theirs runs on the host; ours on the test device (the GPU kernel there)
    for revert in (False, True):
        idx = proc.build_indices(2, 40, 9, d, revert=revert)
        theirs = proc.apply_audio_delay(codes, cases.PAD, cases.BOS, idx)
        with opforge.backend("triton"):
            ours = opforge.revert_delay(on_device, d, pad_id=cases.PAD) if revert else \
                opforge.apply_delay(on_device, d, bos_id=cases.BOS, pad_id=cases.PAD)
        assert torch.equal(ours.cpu(), theirs.to(ours.dtype))


def test_64_bit_index_path(monkeypatch):
    from opforge.ops.delay import triton_kernels
    monkeypatch.setattr(triton_kernels, "WIDE_FROM", 0)
    check_case(cases.make_case("apply_delay", (2, 21, 9), torch.int64, "strided"), "triton")
    check_case(cases.make_case("revert_delay", (2, 21, 9), torch.int32), "triton")


def test_device_mismatch_names_the_argument():
    codes = torch.zeros(2, 5, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="out is on meta but codes is on cpu"):
        opforge.apply_delay(codes, [0, 1, 2], bos_id=1, pad_id=2, out=torch.empty(2, 5, 3, dtype=torch.int64,
                                                                                 device="meta"))


def test_numpy_integer_delays():
    np = pytest.importorskip("numpy")
    codes = torch.randint(0, 9, (1, 6, 3), device=DEVICE)
    out = opforge.apply_delay(codes, np.array([0, 1, 2]), bos_id=-1, pad_id=-2)
    assert torch.equal(out.cpu(), naive_apply(codes.cpu(), [0, 1, 2], -1, -2))


@pytest.mark.parametrize("op", ["apply", "revert"])
def test_float_or_bool_delays_are_refused_after_equal_int_delays_ran(op):
    codes = torch.randint(0, 100, (1, 6, 2), dtype=torch.int32)
    call = (lambda d: opforge.apply_delay(codes, d, bos_id=1, pad_id=2)) if op == "apply" \
        else (lambda d: opforge.revert_delay(codes, d, pad_id=2))
    call([0, 1])                                  # [0, 1] is now cached; 1.0 and True hash the same as 1
    for bad in ([0.0, 1.0], [False, True]):
        with pytest.raises(TypeError, match="delays must be ints"):
            call(bad)
