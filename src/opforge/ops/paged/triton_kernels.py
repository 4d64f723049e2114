"""Triton kernels for paged_attention (split-KV decode, tiled prefill), and the family's Triton variants.

Where a key lives: position ``j`` of sequence ``b`` is slot ``j % block_size`` of block
``block_tables[b, j // block_size]``. A tile of ``BLOCK_N`` keys loads its table entries (a few
distinct ones: ``BLOCK_N / block_size`` pages) and then each key's (D) row from its page, so the
tile size is independent of the block size. Only the table entries of positions below the
sequence's length are loaded; a block id outside ``[0, num_blocks)`` is masked (its keys read as
zeros), so no load or store leaves the pools whatever the tables hold.

``decode`` (max_query_len <= 16): program (sequence x key/value head, split, row block) packs the
``group x max_query_len`` query rows of one key/value head into one tile, reads its slice of the
sequence once for all of them, and writes a normalized partial output and log-sum-exp to a float32
scratch indexed by (sequence, new token, head); a second kernel merges the slices of each row
(with one split the first kernel writes the output itself). Slices divide the sequence's length
as read on the device.

``prefill``: program (query head x sequence, tile of BLOCK_M queries of that sequence) streams
its sequence's keys with an online softmax: whole tiles every row sees run unmasked, the causal
diagonal and the ragged end masked, tiles no row sees are skipped. Tiles past a sequence's own
query count return at once (the grid is sized by ``max_query_len``, a host int).

A step with ``max_query_len`` > 16 runs both: the prefill kernel for the sequences with more
than 16 new tokens, the decode kernel (16 rows per sequence) for the others, so decode tokens
batched beside prefill chunks keep the decode kernel's grouped-head tiles. Each kernel reads the
counts on the device and skips the other's sequences.

The appends' kernels are in ``triton_append.py``.

No kernel reads a device tensor on the host and every size comes from shapes, so all of them can
be captured in a CUDA graph and replayed with new lengths and tables. Under ``TRITON_INTERPRET=1``
dots run in float32 and tiles are 16 wide so small tests cross tile and page boundaries.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.backends import triton_interpreting
from ...runtime.errors import kernel_dtype_reason
from ...runtime.triton.launch import TritonLauncher, cdiv
from . import config
from .problem import MAX_DECODE_QUERIES, AttentionCall, PagedProblem
from .triton_append import launch_append, launch_rotary_append

LOG2E = 1.4426950408889634
MAX_KERNEL_HEAD_DIM = 256


@triton.jit
def _paged_tile(acc, m_i, l_i, q, k_ptr, v_ptr, table_row, num_blocks, k_head, v_head, k_sb, k_ss, v_sb, v_ss,
                start_n, rows_i, offs_n, offs_d, d_ok, end_n, shift, qk_scale, BS: tl.constexpr,
                MASKED: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr, FUSE_SCALE: tl.constexpr):
    """One tile of BLOCK_N keys (positions start_n ..) into the running (acc, max, sum) of every
    query row; MASKED: keys >= end_n hidden and row i sees key j only if j <= rows_i + shift."""
    cols = start_n + offs_n
    inside = cols < end_n
    blk = tl.load(table_row + cols // BS, mask=inside, other=-1).to(tl.int64)
    ok = inside & (blk >= 0) & (blk < num_blocks)
    slot = (cols % BS).to(tl.int64)
    kv_ok = ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + (blk * k_sb + slot * k_ss + k_head)[:, None] + offs_d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(v_ptr + (blk * v_sb + slot * v_ss + v_head)[:, None] + offs_d[None, :], mask=kv_ok, other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if FUSE_SCALE and not MASKED:
        # scale > 0: the scaled row maximum is the maximum of the scaled scores (one FMA per score)
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    else:
        s = s * qk_scale
        if MASKED:
            seen = inside[None, :] & (cols[None, :] <= rows_i[:, None] + shift)
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row that saw nothing yet stays empty
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if IEEE:
        acc = tl.dot(p, v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["lse_off", "tokens", "mq", "rows", "capacity", "max_blocks", "num_splits"])
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, cu_ptr, po_ptr, lse_off, o_ptr,
                         tokens, hkv, hq, mq, rows, capacity, max_blocks, num_blocks, num_splits, qk_scale,
                         q_st, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh,
                         BS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // hkv
    kvh = bk % hkv
    group = rows // mq
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)   # packed query row r = g * mq + i
    g = r // mq
    i = r % mq
    head = kvh * group + g
    first = tl.load(cu_ptr + b).to(tl.int32)
    n = tl.maximum(tl.load(cu_ptr + b + 1).to(tl.int32) - first, 0)
    mine = n <= mq                                             # longer sequences: the prefill kernel's
    tok = first + i
    row_ok = tl.where(mine, (r < rows) & (i < n) & (tok >= 0) & (tok < tokens), False)   # where: scalar & tensor
    out_row = tok.to(tl.int64) * hq + head                     # row of the (T, Hq) output
    part = ((b * mq + i).to(tl.int64) * hq + head) * num_splits + split   # partials by (b, i, head)
    seqlen = tl.minimum(tl.maximum(tl.load(lens_ptr + b).to(tl.int32), 0), capacity)
    span = tl.maximum(tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N), 1) * BLOCK_N
    start = split * span
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    if (start >= seqlen) | (n > mq):   # a slice past this sequence's end, or a sequence for the prefill kernel
        if DIRECT:
            tl.store(o_ptr + out_row[:, None] * D + offs_d[None, :],
                     tl.zeros([BLOCK_R, BLOCK_D], tl.float32).to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])
        else:
            tl.store(po_ptr + lse_off + part, tl.full([BLOCK_R], float("-inf"), tl.float32), mask=row_ok)
    else:
        end = tl.minimum(start + span, seqlen)
        offs_n = tl.arange(0, BLOCK_N)
        q = tl.load(q_ptr + tok.to(tl.int64)[:, None] * q_st + head.to(tl.int64)[:, None] * q_sh + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        table_row = tables_ptr + b.to(tl.int64) * max_blocks
        k_head = kvh.to(tl.int64) * k_sh
        v_head = kvh.to(tl.int64) * v_sh
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        # row i sees keys j <= seqlen - n + i; whole tiles below every row's limit run unmasked
        shift = seqlen - n
        full = start + tl.maximum(tl.minimum(end, shift + 1) - start, 0) // BLOCK_N * BLOCK_N
        for start_n in range(start, full, BLOCK_N):
            acc, m_i, l_i = _paged_tile(acc, m_i, l_i, q, k_ptr, v_ptr, table_row, num_blocks, k_head, v_head,
                                        k_sb, k_ss, v_sb, v_ss, start_n, i, offs_n, offs_d, d_ok, end, shift,
                                        qk_scale, BS, False, DOT_F32, IEEE, False)
        for start_n in range(full, end, BLOCK_N):
            acc, m_i, l_i = _paged_tile(acc, m_i, l_i, q, k_ptr, v_ptr, table_row, num_blocks, k_head, v_head,
                                        k_sb, k_ss, v_sb, v_ss, start_n, i, offs_n, offs_d, d_ok, end, shift,
                                        qk_scale, BS, True, DOT_F32, IEEE, False)
        seen = l_i > 0.0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        if DIRECT:
            tl.store(o_ptr + out_row[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])
        else:
            lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
            tl.store(po_ptr + lse_off + part, lse, mask=row_ok)
            tl.store(po_ptr + part[:, None] * D + offs_d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["lse_off", "tokens", "mq", "num_splits"])
def _combine_kernel(po_ptr, lse_off, o_ptr, cu_ptr, tokens, hq, mq, num_splits, D: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK_S: tl.constexpr, PDL: tl.constexpr = False):
    """Merge the slices of query row (sequence b, new token i, head): weights 2^(lse - max), empty
    slices (lse = -inf) skipped, the partials read CHUNK_S slices at a time. Rows past a sequence's
    new tokens, and sequences with more than mq of them, are left alone."""
    pdl.wait_for_previous(PDL)
    slot = tl.program_id(0).to(tl.int64)
    head = slot % hq
    i = (slot // hq) % mq
    b = slot // (hq * mq)
    first = tl.load(cu_ptr + b).to(tl.int64)
    n = tl.load(cu_ptr + b + 1).to(tl.int64) - first
    tok = first + i
    if (i < n) & (n <= mq) & (tok >= 0) & (tok < tokens):
        lse_row = po_ptr + lse_off + slot * num_splits
        s_all = tl.arange(0, BLOCK_S)
        lse = tl.load(lse_row + s_all, mask=s_all < num_splits, other=float("-inf"))
        m = tl.max(lse, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)
        total = tl.sum(tl.exp2(lse - m), axis=0)
        offs_d = tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for c in range(0, num_splits, CHUNK_S):
            s = c + tl.arange(0, CHUNK_S)
            lse_c = tl.load(lse_row + s, mask=s < num_splits, other=float("-inf"))
            used = lse_c > float("-inf")
            o = tl.load(po_ptr + (slot * num_splits + s)[:, None] * D + offs_d[None, :],
                        mask=used[:, None] & (offs_d < D)[None, :], other=0.0)
            acc += tl.sum(tl.exp2(lse_c - m)[:, None] * o, axis=0)
        out = acc / tl.where(total == 0.0, 1.0, total)
        tl.store(o_ptr + (tok * hq + head) * D + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < D)


@triton.jit(do_not_specialize=["tokens", "min_n", "capacity", "max_blocks"])
def _prefill_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, cu_ptr, o_ptr, tokens, hq, group, min_n, capacity,
                    max_blocks, num_blocks, qk_scale, q_st, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_st, o_sh,
                    BS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr, SCALE_POS: tl.constexpr,
                    PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)       # the longest causal rows first
    b = bh // hq
    h = bh % hq
    kvh = h // group
    first = tl.load(cu_ptr + b).to(tl.int32)
    n = tl.maximum(tl.load(cu_ptr + b + 1).to(tl.int32) - first, 0)
    if (pid_m * BLOCK_M < n) & (n >= min_n):
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        tok = first + offs_m
        row_ok = (offs_m < n) & (tok >= 0) & (tok < tokens)
        q = tl.load(q_ptr + tok.to(tl.int64)[:, None] * q_st + h.to(tl.int64) * q_sh + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        seqlen = tl.minimum(tl.maximum(tl.load(lens_ptr + b).to(tl.int32), 0), capacity)
        shift = seqlen - n                                    # row i sees keys j <= i + shift
        hi = tl.maximum(tl.minimum(seqlen, (pid_m + 1) * BLOCK_M + shift), 0)    # no row sees keys >= hi
        full = tl.maximum(tl.minimum(seqlen, pid_m * BLOCK_M + shift + 1), 0)    # every row sees keys < full
        full = (full // BLOCK_N) * BLOCK_N
        table_row = tables_ptr + b.to(tl.int64) * max_blocks
        k_head = kvh.to(tl.int64) * k_sh
        v_head = kvh.to(tl.int64) * v_sh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start_n in range(0, full, BLOCK_N):
            acc, m_i, l_i = _paged_tile(acc, m_i, l_i, q, k_ptr, v_ptr, table_row, num_blocks, k_head, v_head,
                                        k_sb, k_ss, v_sb, v_ss, start_n, offs_m, offs_n, offs_d, d_ok, seqlen, shift,
                                        qk_scale, BS, False, DOT_F32, IEEE, SCALE_POS)
        for start_n in range(full, hi, BLOCK_N):
            acc, m_i, l_i = _paged_tile(acc, m_i, l_i, q, k_ptr, v_ptr, table_row, num_blocks, k_head, v_head,
                                        k_sb, k_ss, v_sb, v_ss, start_n, offs_m, offs_n, offs_d, d_ok, seqlen, shift,
                                        qk_scale, BS, True, DOT_F32, IEEE, False)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]                      # no key seen: zeros
        tl.store(o_ptr + tok.to(tl.int64)[:, None] * o_st + h.to(tl.int64) * o_sh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


_decode_split = TritonLauncher(_decode_split_kernel)
_combine = TritonLauncher(_combine_kernel)
_prefill = TritonLauncher(_prefill_kernel)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: Optional[int]) -> int:
    """Multiprocessors of a CUDA device; a small stand-in under the interpreter (CPU tensors)."""
    if device_index is None or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sms(t: torch.Tensor) -> int:
    return sm_count(t.device.index if t.device.type == "cuda" else None)


def _dot_flags(dtype: torch.dtype) -> tuple[bool, bool]:
    """(DOT_F32, IEEE): float32 operands under the interpreter; float32 dots in IEEE."""
    return triton_interpreting(), dtype == torch.float32


def _decode_into(call: AttentionCall, out: torch.Tensor, mq: int, splits: Optional[int] = None) -> None:
    """Run the split kernel (and the merge unless one split) for the sequences with at most ``mq``
    new tokens, writing their rows of ``out``."""
    p = call.problem
    q, kp, vp = call.q, call.k_pages, call.v_pages
    rows = p.group * mq
    br, bn, nw, ns, default_splits = config.decode_tiles(p.head_dim, q.element_size(), rows, p.batch, p.kv_heads,
                                                         p.capacity, _sms(q), triton_interpreting())
    row_blocks = cdiv(rows, br)
    splits = default_splits if splits is None else splits
    splits = max(1, min(splits, config.MAX_SPLITS, cdiv(max(p.capacity, 1), bn)))
    slots = p.batch * mq * p.q_heads          # query rows by (sequence, new token, head)
    direct = splits == 1
    if direct:
        part, lse_off = out, 0
    else:   # one scratch: partial outputs, then their log-sum-exps
        lse_off = slots * splits * p.head_dim
        part = torch.empty((lse_off + slots * splits,), dtype=torch.float32, device=q.device)
    dot_f32, ieee = _dot_flags(q.dtype)
    block_d = config.head_block(p.head_dim)
    dependent = pdl.on(q.device)
    _decode_split((p.batch * p.kv_heads, splits, row_blocks),
                  (q, kp, vp, call.block_tables, call.cache_seqlens, call.cu_seqlens, part, lse_off, out,
                   p.tokens, p.kv_heads, p.q_heads, mq, rows, p.capacity, p.max_blocks, p.num_blocks, splits,
                   call.scale * LOG2E, q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), kp.stride(2),
                   vp.stride(0), vp.stride(1), vp.stride(2),
                   p.block_size, p.head_dim, block_d, br, bn, dot_f32, ieee, direct, dependent),
                  num_warps=nw, num_stages=ns)
    if not direct:
        block_s = 16 if splits <= 16 else config.MAX_SPLITS   # two compiled variants whatever the count
        warps = 1 if block_d <= 64 else 2 if block_d <= 128 else 4
        _combine((slots,), (part, lse_off, out, call.cu_seqlens, p.tokens, p.q_heads, mq, splits, p.head_dim,
                            block_d, block_s, 16, dependent),
                 num_warps=warps, num_stages=2)


def _prefill_into(call: AttentionCall, out: torch.Tensor, min_n: int, block_m: Optional[int] = None,
                  block_n: Optional[int] = None, num_warps: Optional[int] = None,
                  num_stages: Optional[int] = None) -> None:
    """Run the prefill kernel for the sequences with at least ``min_n`` new tokens."""
    p = call.problem
    q, kp, vp = call.q, call.k_pages, call.v_pages
    cfg = config.prefill_config(p.head_dim, q.element_size(), triton_interpreting())
    bm, bn, nw, ns = (block_m or cfg[0], block_n or cfg[1], num_warps or cfg[2], num_stages or cfg[3])
    dot_f32, ieee = _dot_flags(q.dtype)
    grid = (p.batch * p.q_heads, cdiv(p.max_query_len, bm))
    _prefill(grid, (q, kp, vp, call.block_tables, call.cache_seqlens, call.cu_seqlens, out, p.tokens, p.q_heads,
                    p.group, min_n, p.capacity, p.max_blocks, p.num_blocks, call.scale * LOG2E,
                    q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), kp.stride(2),
                    vp.stride(0), vp.stride(1), vp.stride(2), out.stride(0), out.stride(1),
                    p.block_size, p.head_dim, config.head_block(p.head_dim), bm, bn, dot_f32, ieee, call.scale > 0,
                    pdl.on(q.device)),
            num_warps=nw, num_stages=ns)


def _output(call: AttentionCall) -> torch.Tensor:
    p = call.problem
    return alloc.empty((p.tokens, p.q_heads, p.head_dim), call.q.dtype, call.q.device)


def launch_decode(call: AttentionCall, splits: Optional[int] = None) -> torch.Tensor:
    """The split-KV kernel for every sequence (at most ``max_query_len`` <= 16 new tokens each);
    ``splits`` overrides the slice count (tests, tuning)."""
    out = _output(call)
    _decode_into(call, out, call.problem.max_query_len, splits)
    return out


def launch_prefill(call: AttentionCall, block_m: Optional[int] = None, block_n: Optional[int] = None,
                   num_warps: Optional[int] = None, num_stages: Optional[int] = None) -> torch.Tensor:
    """The prefill kernel for every sequence, whatever its number of new tokens (tests, tuning);
    keyword arguments override its configuration."""
    out = _output(call)
    _prefill_into(call, out, 0, block_m, block_n, num_warps, num_stages)
    return out


def launch_mixed(call: AttentionCall, splits: Optional[int] = 1) -> torch.Tensor:
    """A step with long chunks (``max_query_len`` > 16): the prefill kernel for the sequences with
    more than 16 new tokens and the split-KV kernel for the others (decode tokens beside prefill
    chunks), each reading the counts on the device and leaving the other kernel's sequences alone;
    ``splits`` sets the split kernel's slice count (None: the decode rule). One slice by default:
    the chunks' tiles dominate such a step, and one compiled variant serves every mixed step
    whatever its batch (the decode rule's choice changed with it and compiled mid-serving)."""
    out = _output(call)
    _decode_into(call, out, MAX_DECODE_QUERIES, splits)
    _prefill_into(call, out, MAX_DECODE_QUERIES + 1)
    return out


def _reason(p: PagedProblem) -> Optional[str]:
    reason = kernel_dtype_reason("triton", p.dtype, "q" if p.op == "paged_attention" else "k_pages")
    if reason:
        return reason
    if p.head_dim > MAX_KERNEL_HEAD_DIM:
        return f"head_dim {p.head_dim} > {MAX_KERNEL_HEAD_DIM}"
    return None


def _decode_reason(p: PagedProblem) -> Optional[str]:
    if not p.decode:
        return f"max_query_len {p.max_query_len} > 16: the prefill kernel's case"
    return _reason(p)


VARIANTS = {
    "paged_attention": (
        ("split_kv", _decode_reason, launch_decode,
         "split-KV decoding over pages: each slice read once per head group, partials merged"),
        ("prefill", _reason, launch_mixed,
         "tiled flash attention over pages for chunks of more than 16 tokens (Q tile vs streamed key tiles, "
         "causal tiles skipped), split-KV for the step's other sequences"),
    ),
    "paged_kv_cache_append": (
        ("scatter", _reason, launch_append, "one program per token: its (heads x D) rows into its slot"),
    ),
    "paged_rotary_kv_cache_append": (
        ("fused", _reason, launch_rotary_append,
         "rotate q and k and write k, v into their slots in one launch (the rotated k never goes through memory)"),
    ),
}
