"""Validation of apply_delay / revert_delay arguments, the delays cache, and the problem variants see."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from ...runtime.lru import LRU
from ...runtime.overlap import check_no_self_overlap
from ...runtime.problem import ProblemRecord

OPS = ("apply_delay", "revert_delay")
CODE_DTYPES = (torch.int32, torch.int64)
#: The largest delay (the kernels read the delays as int32; a delay past T only shifts in fill ids).
MAX_DELAY = 2**31 - 1

Delays = Union[Sequence[int], torch.Tensor]


@dataclass(frozen=True)
class DelayProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    op: str
    dtype: torch.dtype
    device_type: str
    channels: int


    def describe(self) -> str:
        return f"codes {str(self.dtype).replace('torch.', '')} C={self.channels} {self.device_type}"


class DelayCall:
    """A validated call: ``fill_before`` is written where the source time is < 0, ``fill_after`` where >= T."""

    __slots__ = ("problem", "codes", "delays", "out", "fill_before", "fill_after", "note")

    def __init__(self, problem, codes, delays, out, fill_before, fill_after):
        self.problem, self.codes, self.delays, self.out = problem, codes, delays, out
        self.fill_before, self.fill_after, self.note = fill_before, fill_after, ""


#: Bounded: a stream of distinct delay patterns must not grow host or device memory without end.
_device_delays: LRU[tuple, torch.Tensor] = LRU(1024, "delay.delays_tensors")


def delays_tensor(delays: tuple, device: torch.device) -> torch.Tensor:
    """A small int32 device tensor of ``delays``, built once per distinct (delays, device)."""
    key = (delays, device)
    t = _device_delays.get(key)
    if t is None:
        if len(_device_delays) > 1024:
            _device_delays.clear()
        t = _device_delays[key] = torch.tensor(delays, dtype=torch.int32).to(device)
    return t


def _check_fill(name: str, value: object, dtype: torch.dtype) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    info = torch.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"{name}={value} does not fit the codes' dtype {dtype} [{info.min}, {info.max}]")
    return value


def _check_delays(delays: Delays, channels: int, device: torch.device) -> torch.Tensor:
    """The delays as a 1-D integer tensor on ``device`` (a device tensor is used as is, unchecked)."""
    if isinstance(delays, torch.Tensor):
        if delays.dtype.is_floating_point or delays.dtype.is_complex or delays.dtype == torch.bool:
            raise TypeError(f"delays must be an integer tensor, got {delays.dtype}")
        if delays.dim() != 1 or delays.shape[0] != channels:
            raise ValueError(f"delays must have one entry per codebook: shape ({channels},), got {tuple(delays.shape)}")
        if delays.device == device and device.type != "cpu":
            return delays          # no host sync: the values are the caller's contract
        values = tuple(int(d) for d in delays.tolist())
    else:
        try:
            values = tuple(delays)
        except TypeError:
            raise TypeError("delays must be a sequence of ints or an int tensor, "
                            f"got {type(delays).__name__}") from None
        if any(isinstance(d, bool) or not hasattr(d, "__index__") for d in values):
            raise TypeError(f"delays must be ints, got {values}")
        values = tuple(operator.index(d) for d in values)   # numpy integers too
        if len(values) != channels:
            raise ValueError(f"delays must have one entry per codebook (C={channels}), got {len(values)}")
    negative = [i for i, d in enumerate(values) if d < 0]
    if negative:
        raise ValueError(f"delays must be >= 0, got delays[{negative[0]}] = {values[negative[0]]}")
    huge = [i for i, d in enumerate(values) if d > MAX_DELAY]
    if huge:
        raise ValueError(f"delays must be <= {MAX_DELAY} (int32, as the kernels read them), "
                         f"got delays[{huge[0]}] = {values[huge[0]]}")
    if device.type == "cpu" and isinstance(delays, torch.Tensor):
        return delays
    return delays_tensor(values, device)


_problems: LRU[tuple, DelayProblem] = LRU(1024, "delay.problems")


_RANGES = {dt: (torch.iinfo(dt).min, torch.iinfo(dt).max) for dt in CODE_DTYPES}


def prepare(op: str, codes: torch.Tensor, delays: Delays, bos_id: Optional[int], pad_id: int,
            out: Optional[torch.Tensor]) -> DelayCall:
    """Check every argument (raising before anything is written) and describe the call.

    The common case (int codes, a delays list or tuple seen before on this device, in-range ids,
    no ``out``) costs a few attribute reads and one dictionary lookup; anything else goes
    through the detailed path, which also makes the errors.
    """
    if out is None and type(codes) is torch.Tensor and type(delays) in (list, tuple) and type(pad_id) is int:
        rng = _RANGES.get(codes.dtype)
        if rng is not None and codes.dim() == 3 and rng[0] <= pad_id <= rng[1]:
            bos = pad_id if op == "revert_delay" else bos_id
            if type(bos) is int and rng[0] <= bos <= rng[1]:
                device = codes.device
                d = _device_delays.get((tuple(delays), device))
                # 1.0 and True hash as 1: a cached [0, 1] must not admit [0.0, 1.0] past the int check
                if d is not None and all(type(v) is int for v in delays) and d.shape[0] == codes.shape[2]:
                    problem = _problems.get((op, codes.dtype, device.type, codes.shape[2]))
                    if problem is not None:
                        return DelayCall(problem, codes, d, None, bos, pad_id)
    return _prepare_detailed(op, codes, delays, bos_id, pad_id, out)


def _prepare_detailed(op: str, codes: torch.Tensor, delays: Delays, bos_id: Optional[int], pad_id: int,
                      out: Optional[torch.Tensor]) -> DelayCall:
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype not in CODE_DTYPES:
        raise TypeError(f"codes must be int32 or int64, got {codes.dtype}")
    if codes.dim() != 3:
        raise ValueError(f"codes must be (B, T, C), got shape {tuple(codes.shape)}")
    device = codes.device
    d = _check_delays(delays, codes.shape[2], device)
    pad = _check_fill("pad_id", pad_id, codes.dtype)
    bos = _check_fill("bos_id", bos_id, codes.dtype) if op == "apply_delay" else pad
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != codes.shape or out.dtype != codes.dtype:
            raise ValueError(f"out must be {tuple(codes.shape)} {codes.dtype} like codes, "
                             f"got {tuple(out.shape)} {out.dtype}")
        if out.device != device:
            raise ValueError(f"out is on {out.device} but codes is on {device}: all tensors must be on one device")
        check_no_self_overlap("out", out)
        if out.numel() and codes.numel() and _overlap(out, codes):
            raise ValueError("out must not overlap codes (each output element reads another time step)")
        if isinstance(delays, torch.Tensor) and delays.numel() and out.numel() and _overlap(out, delays):
            raise ValueError("out must not overlap delays (the kernels read them while writing out)")
    key = (op, codes.dtype, device.type, codes.shape[2])
    problem = _problems.get(key)
    if problem is None:
        problem = _problems[key] = DelayProblem(*key)
    return DelayCall(problem, codes, d, out, bos, pad)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    def span(t):
        lo = t.data_ptr()
        hi = lo + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) * t.element_size()
        return lo, hi + t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
