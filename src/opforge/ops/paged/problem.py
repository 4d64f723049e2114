"""Validation of the paged-cache ops' arguments, and the problems and calls variants see.

The paged cache holds one K and one V page pool per layer, ``(num_blocks, block_size, Hkv, D)``.
Sequence ``b`` owns the blocks listed in row ``b`` of ``block_tables`` ``(B, max_blocks)``: entry
``j`` holds its positions ``j * block_size .. (j + 1) * block_size - 1``. A step's new tokens are
packed ``(T, H, D)``; sequence ``b`` owns rows ``cu_seqlens[b] : cu_seqlens[b + 1]``.

Shapes, dtypes and devices are checked from metadata only. The values (cumulative lengths, cache
lengths, block ids) are checked on the host where the tensors live on the CPU or a check is asked
for; every check raises before anything is written and names the argument.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from ...runtime.errors import check_attention_scale, check_float_tensor

OPS = ("paged_kv_cache_append", "paged_rotary_kv_cache_append", "paged_attention")
INDEX_DTYPES = (torch.int32, torch.int64)
#: ``paged_attention`` runs the split-KV decode kernel when ``max_query_len`` is at most this.
MAX_DECODE_QUERIES = 16
#: ``OPFORGE_CHECK_SEQLENS=1``: also check paged_attention's lengths and tables on GPU tensors
#: (syncs; a debugging aid). CPU tensors are always checked.
CHECK_SEQLENS_ENV = "OPFORGE_CHECK_SEQLENS"


@dataclass(frozen=True)
class PagedProblem:
    """What a variant needs to decide whether it can run a call; ``key`` drives the selection cache."""

    op: str
    dtype: torch.dtype
    device_type: str
    batch: int
    tokens: int          # T
    q_heads: int         # Hq (0 for the append)
    kv_heads: int        # Hkv
    head_dim: int
    block_size: int
    num_blocks: int
    max_blocks: int      # columns of block_tables
    max_query_len: int = 0   # paged_attention only
    rotary_dim: int = 0      # paged_rotary_kv_cache_append only
    interleaved: bool = False

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.q_heads // self.kv_heads if self.kv_heads else 0

    @property
    def decode(self) -> bool:
        """Few new tokens per sequence: the split-KV decode kernel's case."""
        return self.max_query_len <= MAX_DECODE_QUERIES

    @property
    def capacity(self) -> int:
        """Positions one block-table row can address."""
        return self.max_blocks * self.block_size

    @property
    def key(self) -> tuple:
        # sizes never change the choice, except decode vs prefill for paged_attention
        return (self.dtype, self.head_dim, self.block_size, self.decode, self.rotary_dim, self.interleaved)

    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        pages = f"pages ({self.num_blocks} x {self.block_size}, Hkv={self.kv_heads}, D={self.head_dim}) {dt}"
        head = f"T={self.tokens} B={self.batch}"
        if self.op == "paged_attention":
            head += f" Hq={self.q_heads} max_query_len={self.max_query_len}"
        if self.op == "paged_rotary_kv_cache_append":
            head += f" Hq={self.q_heads} R={self.rotary_dim} {'interleaved' if self.interleaved else 'rotate-half'}"
        return f"{head}, {pages}, tables (B, {self.max_blocks}) {self.device_type}"


class AppendCall:
    """A validated paged_kv_cache_append call."""

    __slots__ = ("problem", "k_pages", "v_pages", "k", "v", "block_tables", "cache_seqlens", "cu_seqlens", "note")

    def __init__(self, problem, k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens):
        self.problem, self.k_pages, self.v_pages, self.k, self.v = problem, k_pages, v_pages, k, v
        self.block_tables, self.cache_seqlens, self.cu_seqlens, self.note = block_tables, cache_seqlens, cu_seqlens, ""


class RotaryAppendCall:
    """A validated paged_rotary_kv_cache_append call: the append, and q, cos, sin, positions, flags."""

    __slots__ = ("problem", "app", "q", "cos", "sin", "positions", "inplace", "note")

    def __init__(self, problem, app: AppendCall, q, cos, sin, positions, inplace):
        self.problem, self.app, self.q, self.cos, self.sin = problem, app, q, cos, sin
        self.positions, self.inplace, self.note = positions, inplace, ""


class AttentionCall:
    """A validated paged_attention call."""

    __slots__ = ("problem", "q", "k_pages", "v_pages", "block_tables", "cache_seqlens", "cu_seqlens", "scale",
                 "note")

    def __init__(self, problem, q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, scale):
        self.problem, self.q, self.k_pages, self.v_pages = problem, q, k_pages, v_pages
        self.block_tables, self.cache_seqlens, self.cu_seqlens = block_tables, cache_seqlens, cu_seqlens
        self.scale, self.note = scale, ""


def signature(*items: object) -> tuple:
    """Every fact validation depends on, short of the values: each tensor's shape, strides, dtype
    and device, and each other argument with its type. A call whose signature passed validation
    before passes it again (only the host value checks still run).

    Example:
        >>> import torch
        >>> x = torch.zeros(2, 3)
        >>> signature(x, 1, None) == signature(x + 1, 1, None), signature(x, 1) == signature(x, True)
        (True, False)
    """
    facts: list = []
    for x in items:
        if isinstance(x, torch.Tensor):
            facts += (x.shape, x.stride(), x.dtype, x.device)
        else:
            facts += (type(x), x)
    return tuple(facts)


def _tensor(name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-d, got shape {tuple(t.shape)}")
    return t


def _index(name: str, t: object, shape: tuple, device: torch.device, what: str) -> torch.Tensor:
    t = _tensor(name, t, len(shape))
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {what}, got {tuple(t.shape)}")
    _same_device(name, t, device)
    return t if t.is_contiguous() else t.contiguous()


def _same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the page pools are on {device}: all tensors must be on "
                         "one device")


def _last_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def _check_pages(k_pages: object, v_pages: object) -> tuple[torch.Tensor, torch.Tensor]:
    k_pages = _tensor("k_pages", k_pages, 4)
    v_pages = _tensor("v_pages", v_pages, 4)
    check_float_tensor("k_pages", k_pages)
    if v_pages.dtype != k_pages.dtype:
        raise TypeError(f"v_pages must have k_pages' dtype {k_pages.dtype}, got {v_pages.dtype}")
    if v_pages.shape != k_pages.shape:
        raise ValueError(f"v_pages must have k_pages' shape {tuple(k_pages.shape)} (num_blocks, block_size, Hkv, "
                         f"D), got {tuple(v_pages.shape)}")
    _same_device("v_pages", v_pages, k_pages.device)
    if k_pages.shape[1] == 0 or k_pages.shape[2] == 0:
        raise ValueError(f"k_pages must have block_size >= 1 and Hkv >= 1, got shape {tuple(k_pages.shape)}")
    _last_contiguous("k_pages", k_pages)
    _last_contiguous("v_pages", v_pages)
    return k_pages, v_pages


def _check_tokens(name: str, t: object, pages: torch.Tensor, heads: Optional[int]) -> torch.Tensor:
    """(T, H, D) new tokens in the pools' dtype, device and D (and H = ``heads`` when given)."""
    t = _tensor(name, t, 3)
    if t.dtype != pages.dtype:
        raise TypeError(f"{name} must have the page pools' dtype {pages.dtype}, got {t.dtype}")
    _same_device(name, t, pages.device)
    d = pages.shape[3]
    if t.shape[2] != d or (heads is not None and t.shape[1] != heads):
        want = f"(T, {heads if heads is not None else 'H'}, D={d})"
        raise ValueError(f"{name} must be {want} to match the page pools {tuple(pages.shape)}, got {tuple(t.shape)}")
    _last_contiguous(name, t)
    return t


def _check_indices(block_tables, cache_seqlens, cu_seqlens, device, tokens: int) -> tuple[torch.Tensor, ...]:
    block_tables = _tensor("block_tables", block_tables, 2)
    b = block_tables.shape[0]
    if b == 0 and tokens:
        raise ValueError(f"block_tables has no sequence (B = 0) but there are T = {tokens} new tokens: "
                         "cu_seqlens = [0] allows none")
    block_tables = _index("block_tables", block_tables, tuple(block_tables.shape), device, "(B, max_blocks)")
    cache_seqlens = _index("cache_seqlens", cache_seqlens, (b,), device, f"(B,) = ({b},)")
    cu_seqlens = _index("cu_seqlens", cu_seqlens, (b + 1,), device, f"(B + 1,) = ({b + 1},)")
    return block_tables, cache_seqlens, cu_seqlens


def wants_check(check: Optional[bool], device_type: str) -> bool:
    """The appends' ``check`` rule: always on CPU; on a GPU by default except while a CUDA graph is
    being captured (a check reads the device tensors on the host)."""
    if device_type == "cpu":
        return True
    if check is None:
        return device_type != "cuda" or not torch.cuda.is_current_stream_capturing()
    return bool(check)


def attention_wants_check(device_type: str) -> bool:
    """paged_attention checks values on CPU tensors, or anywhere with ``OPFORGE_CHECK_SEQLENS=1``."""
    return device_type == "cpu" or os.environ.get(CHECK_SEQLENS_ENV, "") not in ("", "0")


def prepare_append(k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens,
                   op: str = "paged_kv_cache_append") -> AppendCall:
    """Check every paged_kv_cache_append argument by shape, dtype and device and describe the call."""
    k_pages, v_pages = _check_pages(k_pages, v_pages)
    nb, bs, hkv, d = k_pages.shape
    k = _check_tokens("k", k, k_pages, hkv)
    v = _check_tokens("v", v, k_pages, hkv)
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    block_tables, cache_seqlens, cu_seqlens = _check_indices(block_tables, cache_seqlens, cu_seqlens,
                                                             k_pages.device, k.shape[0])
    problem = PagedProblem(op, k_pages.dtype, k_pages.device.type, block_tables.shape[0], k.shape[0], 0, hkv, d,
                           bs, nb, block_tables.shape[1])
    return AppendCall(problem, k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens)


def _check_rotary_tables(cos: object, sin: object, head_dim: int, device: torch.device) -> int:
    for name, t in (("cos", cos), ("sin", sin)):
        _tensor(name, t, 2)
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 table (max_positions, R/2), got {t.dtype}")
        _same_device(name, t, device)
        _last_contiguous(name, t)
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    r = 2 * cos.shape[1]
    if r == 0:
        raise ValueError("cos and sin must have at least one column (rotary dim R = 2 * columns >= 2)")
    if r > head_dim:
        raise ValueError(f"rotary dim R = 2 * cos.shape[1] = {r} exceeds the head dim D = {head_dim}")
    return r


def prepare_rotary_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                          positions, interleaved, inplace) -> RotaryAppendCall:
    """Check every paged_rotary_kv_cache_append argument by shape, dtype and device and describe the call."""
    app = prepare_append(k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens,
                         op="paged_rotary_kv_cache_append")
    q = _check_tokens("q", q, app.k_pages, None)
    t, hq, d = q.shape
    if t != app.k.shape[0]:
        raise ValueError(f"q has {t} tokens but k has {app.k.shape[0]}: q, k and v are the same packed tokens")
    r = _check_rotary_tables(cos, sin, d, q.device)
    if positions is not None:
        positions = _index("positions", positions, (t,), q.device, f"(T,) = ({t},)")
    if not isinstance(interleaved, bool) or not isinstance(inplace, bool):
        raise TypeError("interleaved and inplace must be bools")
    p = app.problem
    problem = PagedProblem(p.op, p.dtype, p.device_type, p.batch, t, hq, p.kv_heads, d, p.block_size, p.num_blocks,
                           p.max_blocks, 0, r, interleaved)
    app.problem = problem
    return RotaryAppendCall(problem, app, q, cos, sin, positions, inplace)


def prepare_attention(q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, max_query_len,
                      scale) -> AttentionCall:
    """Check every paged_attention argument by shape, dtype and device and describe the call."""
    k_pages, v_pages = _check_pages(k_pages, v_pages)
    nb, bs, hkv, d = k_pages.shape
    q = _check_tokens("q", q, k_pages, None)
    t, hq, _ = q.shape
    if hq % hkv != 0:
        raise ValueError(f"q has {hq} heads, which is not a multiple of the {hkv} heads of k_pages and v_pages")
    block_tables, cache_seqlens, cu_seqlens = _check_indices(block_tables, cache_seqlens, cu_seqlens,
                                                             k_pages.device, t)
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"max_query_len must be a host int (the most new tokens of one sequence), "
                        f"got {type(max_query_len).__name__}")
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {max_query_len}")
    scale = check_attention_scale(scale, d)
    problem = PagedProblem("paged_attention", q.dtype, q.device.type, block_tables.shape[0], t, hq, hkv, d, bs, nb,
                           block_tables.shape[1], max_query_len)
    return AttentionCall(problem, q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, scale)


# -- value checks (host reads) ---------------------------------------------------------------------

def _host(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu", torch.int64)


def check_cu_seqlens(cu_seqlens: torch.Tensor, tokens: int, tokens_name: str) -> torch.Tensor:
    """Raise ``ValueError`` unless ``cu_seqlens`` starts at 0, never decreases and ends at T; returns
    the per-sequence token counts (host, int64).

    Example:
        >>> import torch
        >>> check_cu_seqlens(torch.tensor([0, 1, 4]), 4, "q").tolist()
        [1, 3]
        >>> check_cu_seqlens(torch.tensor([0, 1, 3]), 4, "q")
        Traceback (most recent call last):
        ...
        ValueError: cu_seqlens[-1] = 3 must equal T = 4 (the rows of q)
    """
    cu = _host(cu_seqlens)
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens[0] must be 0, got {int(cu[0])}")
    counts = cu[1:] - cu[:-1]
    bad = (counts < 0).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        raise ValueError(f"cu_seqlens must not decrease: cu_seqlens[{b + 1}] = {int(cu[b + 1])} < "
                         f"cu_seqlens[{b}] = {int(cu[b])}")
    if int(cu[-1]) != tokens:
        raise ValueError(f"cu_seqlens[-1] = {int(cu[-1])} must equal T = {tokens} (the rows of {tokens_name})")
    return counts


def check_blocks(block_tables: torch.Tensor, lengths: torch.Tensor, block_size: int, num_blocks: int,
                 writes: bool = False) -> None:
    """Raise ``IndexError`` if a sequence's table row lists a block id outside ``[0, num_blocks)``
    among the blocks its first ``lengths[b]`` positions use (entries past them are not read)."""
    tables = _host(block_tables)
    used = (lengths + block_size - 1) // block_size                       # blocks each sequence uses
    cols = torch.arange(tables.shape[1])
    live = cols[None, :] < used[:, None]
    bad = (live & ((tables < 0) | (tables >= num_blocks))).nonzero()
    if bad.numel():
        b, j = int(bad[0, 0]), int(bad[0, 1])
        raise IndexError(f"block_tables[{b}, {j}] = {int(tables[b, j])} is not a block of the pool "
                         f"[0, {num_blocks}) (sequence {b} uses {int(used[b])} blocks){_UNWRITTEN if writes else ''}")


_UNWRITTEN = "; nothing was written"


def _check_capacity(ends: torch.Tensor, starts: torch.Tensor, capacity: int, what: str, writes: bool) -> None:
    bad = ((starts < 0) | (ends > capacity)).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        raise IndexError(f"cache_seqlens[{b}] = {int(starts[b])}: {what} {int(ends[b])} positions, beyond the "
                         f"{capacity} positions its block_tables row addresses (max_blocks x block_size)"
                         f"{_UNWRITTEN if writes else ''}")


def check_append_values(call: AppendCall) -> None:
    """Host check of an append: cu_seqlens consistent with T, new positions inside each table row's
    capacity, and the blocks they land in inside the pool."""
    p = call.problem
    counts = check_cu_seqlens(call.cu_seqlens, p.tokens, "k")
    starts = _host(call.cache_seqlens)
    ends = starts + counts
    _check_capacity(ends, starts, p.capacity, "the new tokens would fill", True)
    check_blocks(call.block_tables, ends, p.block_size, p.num_blocks, True)


def check_attention_values(call: AttentionCall) -> None:
    """Host check of paged_attention: cu_seqlens consistent with T, no sequence with more than
    max_query_len new tokens, lengths within table capacity, used blocks inside the pool."""
    p = call.problem
    counts = check_cu_seqlens(call.cu_seqlens, p.tokens, "q")
    if counts.numel() and int(counts.max()) > p.max_query_len:
        b = int(counts.argmax())
        raise ValueError(f"sequence {b} has {int(counts[b])} new tokens (cu_seqlens) but max_query_len = "
                         f"{p.max_query_len}")
    lens = _host(call.cache_seqlens)
    _check_capacity(lens, lens, p.capacity, "its length is", False)
    check_blocks(call.block_tables, lens, p.block_size, p.num_blocks)
