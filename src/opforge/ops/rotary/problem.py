"""Validation of rotary_embedding and kv_cache_append arguments, and the problems variants see.

Everything here depends on shapes, dtypes and devices only, except two value checks that need
the data: positions in the cos/sin table's range and cache positions inside ``S_max``. Those run
on the host for CPU tensors (always) and, for ``kv_cache_append`` on CUDA, when ``check`` is
true; the GPU kernels never read or write out of bounds whatever the values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...runtime.errors import check_float_tensor
from ...runtime.lru import LRU
from ...runtime.overlap import check_no_self_overlap, check_writes
from ...runtime.problem import ProblemRecord

OPS = ("rotary_embedding", "kv_cache_append", "rotary_kv_cache_append")
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class RotaryProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    op: str
    dtype: torch.dtype
    device_type: str
    head_dim: int
    rotary_dim: int = 0          # rotary_embedding only
    interleaved: bool = False    # rotary_embedding only


    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        if self.op != "kv_cache_append":
            conv = "interleaved" if self.interleaved else "rotate-half"
            what = "q/k" if self.op == "rotary_embedding" else "q/k/v into k/v cache"
            return f"{what} {dt} D={self.head_dim} R={self.rotary_dim} {conv} {self.device_type}"
        return f"k/v cache {dt} D={self.head_dim} {self.device_type}"


class RotaryCall:
    """A validated rotary_embedding call; ``q_out``/``k_out`` are q/k themselves when in place.

    ``sig`` is the call's signature (``rotary_signature``) when known: kernels keep their launch
    arguments per signature."""

    __slots__ = ("problem", "q", "k", "cos", "sin", "positions", "inplace", "note", "sig")

    def __init__(self, problem, q, k, cos, sin, positions, inplace, sig=None):
        self.problem, self.q, self.k, self.cos, self.sin = problem, q, k, cos, sin
        self.positions, self.inplace, self.note, self.sig = positions, inplace, "", sig


class AppendCall:
    """A validated kv_cache_append call (``sig``: its ``append_signature`` when known)."""

    __slots__ = ("problem", "k_cache", "v_cache", "k", "v", "cache_seqlens", "note", "sig")

    def __init__(self, problem, k_cache, v_cache, k, v, cache_seqlens, sig=None):
        self.problem, self.k_cache, self.v_cache, self.k, self.v = problem, k_cache, v_cache, k, v
        self.cache_seqlens, self.note, self.sig = cache_seqlens, "", sig


def rotary_signature(q, k, cos, sin, positions, interleaved, inplace) -> Optional[tuple]:
    """Every fact that validation and the launch arguments of a rotary_embedding call depend on
    (shapes, strides, dtypes, devices, flags), or None where an argument is not tensor-like.

    A signature seen in a call that passed validation proves the next call with it valid, except
    for the values (positions in the table), which only CPU tensors check.

    Example:
        >>> import torch
        >>> x, t, p = torch.zeros(1, 2, 3, 8), torch.zeros(4, 2), torch.zeros(3, dtype=torch.int64)
        >>> rotary_signature(x, x, t, t, p, False, True) == rotary_signature(x + 1, x, t, t, p, False, True)
        True
        >>> rotary_signature(x, x, t, t, None, False, True) is None
        True
    """
    try:
        return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
                cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(), sin.dtype, sin.device,
                positions.shape, positions.stride(), positions.dtype, positions.device, interleaved, inplace)
    except (AttributeError, TypeError):
        return None


def append_signature(k_cache, v_cache, k, v, cache_seqlens) -> Optional[tuple]:
    """As ``rotary_signature``, for kv_cache_append.

    Example:
        >>> import torch
        >>> c, x = torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 1, 8)
        >>> append_signature(c, c, x, x, torch.zeros(2, dtype=torch.int32)) is not None
        True
    """
    try:
        return (k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device, v_cache.shape, v_cache.stride(),
                v_cache.dtype, v_cache.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(), v.dtype,
                v.device, cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype, cache_seqlens.device)
    except (AttributeError, TypeError):
        return None


def _tensor(name: str, t: object, ndim: Optional[int] = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-d, got shape {tuple(t.shape)}")
    return t


def _last_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def _same_device(name: str, t: torch.Tensor, device: torch.device, ref: str) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but {ref} is on {device}: all tensors must be on one device")


_problems: LRU[tuple, RotaryProblem] = LRU(4096, "rotary.problems")


def _problem(*fields) -> RotaryProblem:
    problem = _problems.get(fields)
    if problem is None:
        problem = _problems[fields] = RotaryProblem(*fields)
    return problem


def check_table_range(positions: torch.Tensor, rows: int) -> None:
    """Raise ``IndexError`` unless every position is in ``[0, rows)`` (reads the values: host side)."""
    if positions.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(positions))
    if lo < 0 or hi >= rows:
        bad = lo if lo < 0 else hi
        raise IndexError(f"positions must be in [0, {rows}) (the rows of cos/sin), got {bad}")


def prepare_rotary(q, k, cos, sin, positions, interleaved: bool = False, inplace: bool = False,
                   op: str = "rotary_embedding") -> RotaryCall:
    """Check every rotary_embedding argument (raising before anything is written) and describe the call.

    ``op="rotary_kv_cache_append"`` allows ``positions=None`` (taken from the cache lengths)."""
    q = _tensor("q", q, 4)
    k = _tensor("k", k, 4)
    check_float_tensor("q", q)
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(f"k must be (B={b}, Hkv, S={s}, D={d}) to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    _last_contiguous("q", q)
    _last_contiguous("k", k)
    device = q.device
    _same_device("k", k, device, "q")
    for name, t in (("cos", cos), ("sin", sin)):
        _tensor(name, t, 2)
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 table (max_positions, R/2), got {t.dtype}")
        _same_device(name, t, device, "q")
        _last_contiguous(name, t)
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    r = 2 * cos.shape[1]
    if r == 0:
        raise ValueError("cos and sin must have at least one column (rotary dim R = 2 * columns >= 2)")
    if r > d:
        raise ValueError(f"rotary dim R = 2 * cos.shape[1] = {r} exceeds the head dim D = {d}")
    if positions is not None or op == "rotary_embedding":
        positions = _tensor("positions", positions)
        if positions.dtype not in INDEX_DTYPES:
            raise TypeError(f"positions must be int32 or int64, got {positions.dtype}")
        if tuple(positions.shape) not in ((b, s), (s,)):
            raise ValueError(f"positions must have shape (B, S) = ({b}, {s}) or (S,) = ({s},), "
                             f"got {tuple(positions.shape)}")
        _same_device("positions", positions, device, "q")
    if not isinstance(interleaved, bool) or not isinstance(inplace, bool):
        raise TypeError("interleaved and inplace must be bools")
    if device.type == "cpu" and positions is not None and positions.numel():
        check_table_range(positions, cos.shape[0])
    if inplace:
        check_no_self_overlap("q", q)
        if op == "rotary_embedding":
            check_no_self_overlap("k", k)
    problem = _problem(op, q.dtype, device.type, d, r, interleaved)
    return RotaryCall(problem, q, k, cos, sin, positions, inplace)


def check_rotary_writes(q, k, cos, sin, positions, inplace) -> None:
    """Raise ``AliasedOutputError`` if rotary_embedding with ``inplace`` would write q or k where
    the other or a table reads (their self-overlap is checked with the strides, in
    ``prepare_rotary``)."""
    if inplace:
        check_writes([("q", q), ("k", k)], [("cos", cos), ("sin", sin), ("positions", positions)])


def prepare_append(k_cache, v_cache, k, v, cache_seqlens) -> AppendCall:
    """Check every kv_cache_append argument by shape, dtype and device (not the values) and describe the call."""
    k_cache = _tensor("k_cache", k_cache, 4)
    v_cache = _tensor("v_cache", v_cache, 4)
    k = _tensor("k", k, 4)
    v = _tensor("v", v, 4)
    check_float_tensor("k_cache", k_cache)
    for name, t in (("v_cache", v_cache), ("k", k), ("v", v)):
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have k_cache's dtype {k_cache.dtype}, got {t.dtype}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    b, h, _, d = k_cache.shape
    if k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
        raise ValueError(f"k must be (B={b}, Hkv={h}, S_new, D={d}) to match k_cache {tuple(k_cache.shape)}, "
                         f"got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    device = k_cache.device
    for name, t in (("v_cache", v_cache), ("k", k), ("v", v)):
        _same_device(name, t, device, "k_cache")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        _last_contiguous(name, t)
    cache_seqlens = _tensor("cache_seqlens", cache_seqlens)
    if cache_seqlens.dtype not in INDEX_DTYPES:
        raise TypeError(f"cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (b,):
        raise ValueError(f"cache_seqlens must have shape (B,) = ({b},), got {tuple(cache_seqlens.shape)}")
    _same_device("cache_seqlens", cache_seqlens, device, "k_cache")
    check_no_self_overlap("k_cache", k_cache)
    check_no_self_overlap("v_cache", v_cache)
    problem = _problem("kv_cache_append", k_cache.dtype, device.type, d)
    return AppendCall(problem, k_cache, v_cache, k, v, cache_seqlens)


def check_append_writes(k_cache, v_cache, k, v, cache_seqlens, q=None, inplace=False, cos=None, sin=None,
                        positions=None) -> None:
    """Raise ``AliasedOutputError`` if kv_cache_append (or rotary_kv_cache_append, with q) would
    write a cache where the other cache or an input lies, or (``inplace``) q where they lie."""
    written = [("k_cache", k_cache), ("v_cache", v_cache)] + ([("q", q)] if inplace else [])
    read = [("k", k), ("v", v), ("cache_seqlens", cache_seqlens), ("cos", cos), ("sin", sin),
            ("positions", positions), ("q", None if inplace else q)]
    check_writes(written, read)


def check_append_range(call: AppendCall) -> None:
    """Raise ``IndexError`` naming the first sequence whose new positions leave ``[0, S_max)``.

    Reads ``cache_seqlens`` on the host: a device synchronization on a GPU.
    """
    s_new, s_max = call.k.shape[2], call.k_cache.shape[2]
    lens = call.cache_seqlens.tolist()
    if not lens or (min(lens) >= 0 and max(lens) + s_new <= s_max):
        return
    for i, start in enumerate(lens):
        if start < 0 or start + s_new > s_max:
            raise IndexError(f"kv_cache_append: sequence {i} would write positions {start}..{start + s_new - 1} "
                             f"but the cache holds positions 0..{s_max - 1} (cache_seqlens[{i}] = {start}, "
                             f"S_new = {s_new}, S_max = {s_max}); nothing was written")


class FusedCall:
    """A validated rotary_kv_cache_append call: the rotary part and the append part."""

    __slots__ = ("problem", "rot", "app", "note", "sig")

    def __init__(self, rot: RotaryCall, app: AppendCall, sig=None):
        self.problem, self.rot, self.app, self.note, self.sig = rot.problem, rot, app, "", sig

    def positions(self) -> torch.Tensor:
        """The rotation positions: the given ones, or ``cache_seqlens[b] + s`` (a device op, no sync)."""
        if self.rot.positions is not None:
            return self.rot.positions
        lens = self.app.cache_seqlens
        s = self.rot.q.shape[2]
        return lens.view(-1, 1) + torch.arange(s, device=lens.device, dtype=lens.dtype).view(1, s)


class _NoPositions:
    """Stands for ``positions=None`` in a signature."""

    shape = dtype = device = None

    def stride(self) -> None:
        return None


_NO_POSITIONS = _NoPositions()


def fused_signature(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, interleaved,
                    inplace) -> Optional[tuple]:
    """As ``rotary_signature``, for rotary_kv_cache_append (``positions`` may be None).

    Example:
        >>> import torch
        >>> x, c, t = torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 4, 8), torch.zeros(4, 4)
        >>> fused_signature(x, x, x, c, c, torch.zeros(1, dtype=torch.int32), t, t, None, False, False) is None
        False
    """
    rot = rotary_signature(q, k, cos, sin, _NO_POSITIONS if positions is None else positions, interleaved, inplace)
    app = append_signature(k_cache, v_cache, k, v, cache_seqlens)
    return None if rot is None or app is None else rot + app


def prepare_fused(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions=None,
                  interleaved: bool = False, inplace: bool = False) -> FusedCall:
    """Check every rotary_kv_cache_append argument by shape, dtype and device and describe the call."""
    rot = prepare_rotary(q, k, cos, sin, positions, interleaved, inplace, op="rotary_kv_cache_append")
    app = prepare_append(k_cache, v_cache, k, v, cache_seqlens)
    if k_cache.device != q.device:
        raise ValueError(f"k_cache is on {k_cache.device} but q is on {q.device}: all tensors must be on one device")
    return FusedCall(rot, app)
