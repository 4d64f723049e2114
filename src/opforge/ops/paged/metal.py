"""Metal kernels for the paged cache: launch wrappers and the ``metal`` variants.

The kernels are in ``paged.metal`` next to this file (see its header for the exact semantics,
which match the Triton kernels):

* ``split_kv`` (``paged_attention``): one threadgroup per (token, kv head, chunk of up to 8 of its
  query heads, KV split), a simdgroup per query head, a key per lane; partial outputs merged by a
  combine kernel. With ``max_query_len`` > 16 and D in ``PREFILL_HEAD_DIMS`` it takes the
  sequences with at most 16 new tokens, and ``paged_prefill`` (simdgroup 8x8 matrices, a
  threadgroup per 32 new tokens of a sequence and query head) the others; any other D runs every
  row through the split kernel (correct, not tiled).
* ``scatter`` (``paged_kv_cache_append``) and ``fused`` (``paged_rotary_kv_cache_append``): a
  32-thread threadgroup per (token, head).

Index tensors are bound as int32 (int64 ones are converted on the device: no host read). On MPS
tensors the kernels run through ``torch.mps.compile_shader``; on CPU tensors, with
``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests. Kernels bind raw storage, so
the launchers check what they bind.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...runtime import alloc
from ...runtime import metal as metal_runtime
from ...runtime.errors import kernel_dtype_reason
from .problem import MAX_DECODE_QUERIES, AppendCall, AttentionCall, PagedProblem, RotaryAppendCall

SOURCE = Path(__file__).with_name("paged.metal")
SIMD_WIDTH = metal_runtime.SIMD_WIDTH
TYPE_NAMES = metal_runtime.TYPE_NAMES
MAX_HEAD_DIM = 256        # kMaxD in paged.metal
MAX_HEADS = 8             # kHeads: query heads (simdgroups) per attention threadgroup
TARGET_GROUPS = 1024      # enough threadgroups to fill a large Apple GPU
MAX_SPLITS = 64
MIN_SPLIT_KEYS = 64
PREFILL_HEAD_DIMS = (64, 80, 96, 128, 256)   # PAGED_PREFILL_KERNELS in paged.metal
PREFILL_ROWS = 32         # kTileRows: new tokens per prefill threadgroup
PREFILL_THREADS = 128     # kPrefillThreads: 4 simdgroups
EVERY_SEQUENCE = 1 << 62  # a max_n no sequence exceeds


def kernel_name(kind: str, dtype: torch.dtype) -> str:
    """The MSL function of a kernel kind (attention, combine, append, rotary_append) and dtype.

    Example:
        >>> kernel_name("attention", torch.float16)
        'paged_attention_half'
    """
    return f"paged_{kind}_{TYPE_NAMES[dtype]}"


def _bound(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Kernels bind raw storage: refuse a tensor whose dtype or device is wrong."""
    if t.dtype != dtype or t.device != device:
        raise RuntimeError(f"metal launcher: {name} must be {dtype} on {device}, got {t.dtype} on {t.device}")
    return t


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def heads_per_threadgroup(group: int) -> int:
    """Query heads (simdgroups) per attention threadgroup: the largest divisor of the GQA group
    size that is at most ``MAX_HEADS``.

    Example:
        >>> heads_per_threadgroup(4), heads_per_threadgroup(12)
        (4, 6)
    """
    return max(h for h in range(1, min(group, MAX_HEADS) + 1) if group % h == 0)


def splits(rows: int, capacity: int) -> int:
    """KV splits for ``rows`` = T * Hq query rows and table rows of ``capacity`` positions: enough
    threadgroups to fill the GPU, at most ``MAX_SPLITS``, at least ``MIN_SPLIT_KEYS`` keys each.

    Example:
        >>> splits(32, 32768), splits(4096, 4096), splits(8, 100)
        (32, 1, 2)
    """
    want = -(-TARGET_GROUPS // max(rows, 1))
    return max(1, min(want, MAX_SPLITS, -(-capacity // MIN_SPLIT_KEYS)))


def _split_into(call: AttentionCall, out: torch.Tensor, max_n: int, n_split: Optional[int]) -> None:
    """The split kernel and its merge for the tokens of sequences with at most ``max_n`` new tokens."""
    p = call.problem
    device, dtype = call.q.device, p.dtype
    q, kp, vp = (_bound(n, t, dtype, device) for n, t in (("q", call.q), ("k_pages", call.k_pages),
                                                           ("v_pages", call.v_pages)))
    rows = p.tokens * p.q_heads
    n_split = n_split or splits(rows, p.capacity)
    per_split = -(-max(p.capacity, 1) // n_split)
    chunk = -(-per_split // SIMD_WIDTH) * SIMD_WIDTH
    part_o = torch.empty(rows * n_split * p.head_dim, dtype=torch.float32, device=device)
    part_lse = torch.empty(rows * n_split, dtype=torch.float32, device=device)
    heads = heads_per_threadgroup(p.group)
    cu = _int32(call.cu_seqlens)
    shape = [p.tokens, p.batch, p.q_heads, p.group, heads, p.head_dim, p.block_size, p.max_blocks, p.num_blocks,
             n_split, chunk, q.stride(0), q.stride(1), *kp.stride()[:3], *vp.stride()[:3], max_n]
    attend = metal_runtime.kernel(SOURCE, kernel_name("attention", dtype), device.type)
    combine = metal_runtime.kernel(SOURCE, kernel_name("combine", dtype), device.type)
    attend(q, kp, vp, _int32(call.block_tables), _int32(call.cache_seqlens), cu, part_o, part_lse, shape,
           float(call.scale), threads=rows * n_split * SIMD_WIDTH, group_size=heads * SIMD_WIDTH)
    combine(part_o, part_lse, out, cu, [p.batch, p.q_heads, max_n, p.head_dim, n_split], threads=rows * SIMD_WIDTH,
            group_size=SIMD_WIDTH)


def _prefill_into(call: AttentionCall, out: torch.Tensor, min_n: int) -> None:
    """The tiled kernel for the sequences with at least ``min_n`` new tokens."""
    p = call.problem
    device, dtype = call.q.device, p.dtype
    q, kp, vp = (_bound(n, t, dtype, device) for n, t in (("q", call.q), ("k_pages", call.k_pages),
                                                           ("v_pages", call.v_pages)))
    groups = p.batch * p.q_heads * -(-p.max_query_len // PREFILL_ROWS)
    shape = [p.batch, p.q_heads, p.group, p.max_query_len, min_n, p.block_size, p.max_blocks, p.num_blocks,
             q.stride(0), q.stride(1), *kp.stride()[:3], *vp.stride()[:3], out.stride(0), out.stride(1)]
    fn = metal_runtime.kernel(SOURCE, f"paged_prefill_{TYPE_NAMES[dtype]}_d{p.head_dim}", device.type)
    fn(q, kp, vp, out, _int32(call.block_tables), _int32(call.cache_seqlens), _int32(call.cu_seqlens), shape,
       float(call.scale), threads=groups * PREFILL_THREADS, group_size=PREFILL_THREADS)


def tiled(p: PagedProblem) -> bool:
    """Whether a call runs the tiled prefill kernel for its long sequences.

    Example:
        >>> from opforge.ops.paged.problem import PagedProblem
        >>> tiled(PagedProblem("paged_attention", torch.float16, "mps", 2, 600, 32, 8, 128, 16, 99, 40, 512))
        True
    """
    return not p.decode and p.head_dim in PREFILL_HEAD_DIMS


def launch_attention(call: AttentionCall, n_split: Optional[int] = None) -> torch.Tensor:
    """Run a validated ``AttentionCall``: the split kernel for every sequence, or (``tiled``) for
    the sequences with at most 16 new tokens and the tiled kernel for the others; ``n_split``
    fixes the split kernel's number of KV splits."""
    p = call.problem
    out = alloc.empty((p.tokens, p.q_heads, p.head_dim), p.dtype, call.q.device)
    if tiled(p):
        _split_into(call, out, MAX_DECODE_QUERIES, n_split)
        _prefill_into(call, out, MAX_DECODE_QUERIES + 1)
    else:
        _split_into(call, out, EVERY_SEQUENCE, n_split)
    return out


def launch_prefill(call: AttentionCall) -> torch.Tensor:
    """The tiled kernel for every sequence, whatever its number of new tokens (tests); D must be in
    ``PREFILL_HEAD_DIMS``."""
    p = call.problem
    out = alloc.empty((p.tokens, p.q_heads, p.head_dim), p.dtype, call.q.device)
    _prefill_into(call, out, 0)
    return out


def launch_append(call: AppendCall) -> None:
    p = call.problem
    device = call.k.device
    k, v, kp, vp = (_bound(n, t, p.dtype, device) for n, t in (("k", call.k), ("v", call.v),
                                                               ("k_pages", call.k_pages), ("v_pages", call.v_pages)))
    fn = metal_runtime.kernel(SOURCE, kernel_name("append", p.dtype), device.type)
    shape = [p.tokens, p.batch, p.kv_heads, p.head_dim, p.block_size, p.max_blocks, p.num_blocks,
             k.stride(0), k.stride(1), v.stride(0), v.stride(1), *kp.stride()[:3], *vp.stride()[:3]]
    fn(k, v, kp, vp, _int32(call.block_tables), _int32(call.cache_seqlens), _int32(call.cu_seqlens), shape,
       threads=p.tokens * p.kv_heads * SIMD_WIDTH, group_size=SIMD_WIDTH)
    return None


def launch_rotary_append(call: RotaryAppendCall) -> torch.Tensor:
    p = call.problem
    app = call.app
    device = call.q.device
    q, k, v, kp, vp = (_bound(n, t, p.dtype, device) for n, t in (("q", call.q), ("k", app.k), ("v", app.v),
                                                                  ("k_pages", app.k_pages), ("v_pages", app.v_pages)))
    cos, sin = (_bound(n, t, torch.float32, device) for n, t in (("cos", call.cos), ("sin", call.sin)))
    qo = q if call.inplace else alloc.empty((p.tokens, p.q_heads, p.head_dim), p.dtype, device)
    lens = _int32(app.cache_seqlens)
    positions = _int32(call.positions) if call.positions is not None else lens   # an unread stand-in
    shape = [p.tokens, p.batch, p.q_heads, p.kv_heads, p.head_dim, p.rotary_dim // 2, cos.shape[0],
             int(p.interleaved), int(call.positions is not None), int(not call.inplace), p.block_size, p.max_blocks,
             p.num_blocks, q.stride(0), q.stride(1), qo.stride(0), qo.stride(1), k.stride(0), k.stride(1),
             v.stride(0), v.stride(1), *kp.stride()[:3], *vp.stride()[:3], cos.stride(0), sin.stride(0)]
    fn = metal_runtime.kernel(SOURCE, kernel_name("rotary_append", p.dtype), device.type)
    fn(q, k, v, qo, kp, vp, cos, sin, positions, _int32(app.block_tables), lens, _int32(app.cu_seqlens), shape,
       threads=p.tokens * (p.q_heads + 2 * p.kv_heads) * SIMD_WIDTH, group_size=SIMD_WIDTH)
    return qo


def _dtype_reason(p: PagedProblem) -> Optional[str]:
    name = "q" if p.op == "paged_attention" else "k_pages"
    return kernel_dtype_reason("metal", p.dtype, name) or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, kernel_name("combine", torch.bfloat16))


def supports(p: PagedProblem) -> Optional[str]:
    """None if the Metal kernels take problem ``p``, else why not."""
    if not 0 < p.head_dim <= MAX_HEAD_DIM:
        return _dtype_reason(p) or f"head_dim={p.head_dim}: the Metal paged kernels take up to {MAX_HEAD_DIM}"
    return _dtype_reason(p)


VARIANTS = {
    "paged_attention": (
        ("split_kv", supports, launch_attention,
         "a key per lane over the table's blocks, simd_max/simd_sum, KV splits merged by a combine kernel; "
         "chunks of more than 16 tokens by simdgroup 8x8 matrices (D in 64, 80, 96, 128, 256)"),
    ),
    "paged_kv_cache_append": (
        ("scatter", supports, launch_append, "a 32-thread threadgroup per (token, head) into its slot"),
    ),
    "paged_rotary_kv_cache_append": (
        ("fused", supports, launch_rotary_append, "q and k heads rotated, k and v written to their slots, one launch"),
    ),
}
