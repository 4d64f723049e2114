"""Validation of attention / decode_attention arguments, and the problem descriptions variants see.

Every backend (Triton, Metal, torch) reads the same two call classes:

* ``AttentionCall``: ``q`` (B, Hq, Sq, D), ``k`` / ``v`` (B, Hkv, Sk, D), ``causal``, ``scale``.
* ``DecodeCall``: ``q`` (B, Hq, Sq, D), ``k_cache`` / ``v_cache`` (B, Hkv, S_max, D),
  ``cache_seqlens`` (B,) int32/int64, ``scale``.

Tensors keep the caller's batch/head/sequence strides (a ``(B, S, H, D)`` tensor viewed through
``.transpose(1, 2)`` is read in place); only a last dimension that is not contiguous is copied,
and ``note`` then says so. Every check raises before anything is written, naming the argument.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ...runtime.errors import check_attention_scale, check_float_tensor
from ...runtime.lru import LRU
from ...runtime.problem import ProblemRecord

OPS = ("attention", "decode_attention")

#: Decode takes at most this many new tokens per sequence (the queries of one step).
MAX_DECODE_QUERIES = 16
#: Head dimensions the Triton kernels take (the block is padded to a power of two >= 16).
MAX_KERNEL_HEAD_DIM = 256
#: ``OPFORGE_CHECK_SEQLENS=1``: also check cache_seqlens values on CUDA tensors (syncs the GPU;
#: a debugging aid, never on by default; CPU tensors are always checked).
CHECK_SEQLENS_ENV = "OPFORGE_CHECK_SEQLENS"


@dataclass(frozen=True)
class AttentionProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    op: str
    dtype: torch.dtype
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int          # Sq
    kv_len: int         # Sk (prefill) or S_max (decode)
    head_dim: int
    causal: bool
    device_type: str

    @property
    def group(self) -> int:
        """Query heads per key/value head (1: MHA, Hq: MQA)."""
        return self.q_heads // self.kv_heads


    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        what = "k/v" if self.op == "attention" else "caches"
        return (f"q {dt} (B={self.batch}, Hq={self.q_heads}, Sq={self.q_len}, D={self.head_dim}), {what} "
                f"(Hkv={self.kv_heads}, {'Sk' if self.op == 'attention' else 'S_max'}={self.kv_len})"
                f"{' causal' if self.causal and self.op == 'attention' else ''} {self.device_type}")


class AttentionCall:
    """A validated prefill call: the problem, the (possibly copied) tensors, the scale and notes."""

    __slots__ = ("problem", "q", "k", "v", "scale", "causal", "note")

    def __init__(self, problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 scale: float, causal: bool, note: str):
        self.problem, self.q, self.k, self.v = problem, q, k, v
        self.scale, self.causal, self.note = scale, causal, note


class DecodeCall:
    """A validated decode call: the problem, q, the caches, the per-sequence lengths, the scale."""

    __slots__ = ("problem", "q", "k_cache", "v_cache", "cache_seqlens", "scale", "note")

    def __init__(self, problem: AttentionProblem, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cache_seqlens: torch.Tensor, scale: float, note: str):
        self.problem, self.q, self.k_cache, self.v_cache = problem, q, k_cache, v_cache
        self.cache_seqlens, self.scale, self.note = cache_seqlens, scale, note


_problems: LRU[tuple, AttentionProblem] = LRU(4096, "attention.problems")


def _problem(*fields) -> AttentionProblem:
    """Problems are interned for the hot path (a frozen dataclass costs microseconds to build)."""
    problem = _problems.get(fields)
    if problem is None:
        problem = _problems[fields] = AttentionProblem(*fields)
    return problem


def _check_tensor(name: str, t: object) -> torch.Tensor:
    check_float_tensor(name, t)
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-d (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    return t


def _check_pair(q: torch.Tensor, names: tuple[str, str, str], k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes, dtypes and devices of q against a key/value pair (prefill k/v or decode caches)."""
    qs, ks, vs = q.shape, k.shape, v.shape
    dtype = q.dtype
    if k.dtype == dtype and v.dtype == dtype and ks[0] == qs[0] == vs[0] and ks[3] == qs[3] == vs[3] \
            and ks[1] == vs[1] and ks[2] == vs[2] and ks[1] and qs[1] % ks[1] == 0:
        device = q.device
        if k.device == device and v.device == device:
            return  # the common case in a few reads; otherwise the checks below name what is wrong
    qn, kn, vn = names
    for name, t in ((kn, k), (vn, v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but {qn} is on {q.device}: all tensors must be on one device")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} is {t.dtype} but {qn} is {q.dtype}: q, k and v must share one dtype")
        if t.shape[0] != q.shape[0]:
            raise ValueError(f"{name} has batch {t.shape[0]} but {qn} has batch {q.shape[0]}")
        if t.shape[3] != q.shape[3]:
            raise ValueError(f"{name} has head_dim {t.shape[3]} but {qn} has head_dim {q.shape[3]}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"{vn} has {v.shape[1]} heads but {kn} has {k.shape[1]}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"{vn} has sequence length {v.shape[2]} but {kn} has {k.shape[2]}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"{qn} has {hq} heads, which is not a multiple of the {hkv} heads of {kn} and {vn}")


def in_place(name: str, t: torch.Tensor) -> tuple[torch.Tensor, str]:
    """``t`` itself when its last dimension is contiguous (any other strides are read in place),
    else a packed copy and a note that says so."""
    if t.stride(3) == 1 or t.shape[3] <= 1:
        return t, ""
    return t.contiguous(), f"{name} copied: its last dimension is not contiguous (stride {t.stride(3)})"


def _join(notes) -> str:
    return "; ".join(n for n in notes if n)


def prepare_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: object,
                      scale: object) -> AttentionCall:
    """Check every prefill argument (raising before anything is written) and describe the call."""
    _check_tensor("q", q)
    _check_tensor("k", k)
    _check_tensor("v", v)
    _check_pair(q, ("q", "k", "v"), k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    b, hq, sq, d = q.shape
    scale = check_attention_scale(scale, d)
    problem = _problem("attention", q.dtype, b, hq, k.shape[1], sq, k.shape[2], d, causal, q.device.type)
    (q, nq), (k, nk), (v, nv) = in_place("q", q), in_place("k", k), in_place("v", v)
    return AttentionCall(problem, q, k, v, scale, causal, _join((nq, nk, nv)))


def check_cache_seqlens(cache_seqlens: torch.Tensor, s_max: int) -> None:
    """Raise ``ValueError`` if any length is negative or beyond ``s_max``. Reads the values, so on a
    GPU tensor it synchronizes: ``decode_attention`` calls it for CPU tensors always and for CUDA
    tensors only when ``OPFORGE_CHECK_SEQLENS=1`` (a debugging aid, not capturable in a CUDA graph).

    Example:
        >>> import torch
        >>> check_cache_seqlens(torch.tensor([3, 7], dtype=torch.int32), 8)
        >>> check_cache_seqlens(torch.tensor([9], dtype=torch.int32), 8)
        Traceback (most recent call last):
        ...
        ValueError: cache_seqlens must lie in [0, S_max=8]; got values in [9, 9]
    """
    values = cache_seqlens.tolist()  # one copy to the host (two reductions cost more on the CPU)
    if not values:
        return
    lo, hi = min(values), max(values)
    if lo < 0 or hi > s_max:
        raise ValueError(f"cache_seqlens must lie in [0, S_max={s_max}]; got values in [{lo}, {hi}]")


def _check_values_here(seqlens: torch.Tensor) -> bool:
    return seqlens.device.type == "cpu" or os.environ.get(CHECK_SEQLENS_ENV, "") not in ("", "0")


def prepare_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: object,
                   scale: object) -> DecodeCall:
    """Check every decode argument (raising before anything is written) and describe the call.

    Shapes, dtypes and devices are checked on the host from metadata only. The values of
    ``cache_seqlens`` are checked when they live on the CPU (or with ``OPFORGE_CHECK_SEQLENS=1``);
    on a GPU they are never read on the host (the kernels clamp them to [0, S_max]).
    """
    _check_tensor("q", q)
    _check_tensor("k_cache", k_cache)
    _check_tensor("v_cache", v_cache)
    _check_pair(q, ("q", "k_cache", "v_cache"), k_cache, v_cache)
    b, hq, sq, d = q.shape
    if not 1 <= sq <= MAX_DECODE_QUERIES:
        raise ValueError(f"q has {sq} queries per sequence; decode_attention takes 1 to {MAX_DECODE_QUERIES} "
                         "(use opforge.attention for prefill)")
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be a torch.Tensor, got {type(cache_seqlens).__name__}")
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (b,):
        raise ValueError(f"cache_seqlens must have shape ({b},) (one length per sequence), "
                         f"got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but q is on {q.device}: "
                         "all tensors must be on one device")
    s_max = k_cache.shape[2]
    if _check_values_here(cache_seqlens):
        check_cache_seqlens(cache_seqlens, s_max)
    scale = check_attention_scale(scale, d)
    problem = _problem("decode_attention", q.dtype, b, hq, k_cache.shape[1], sq, s_max, d, True,
                               q.device.type)
    (q, nq), (k, nk), (v, nv) = in_place("q", q), in_place("k_cache", k_cache), in_place("v_cache", v_cache)
    if not cache_seqlens.is_contiguous():
        cache_seqlens = cache_seqlens.contiguous()
    return DecodeCall(problem, q, k, v, cache_seqlens, scale, _join((nq, nk, nv)))
