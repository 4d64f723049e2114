"""Triton kernels for the paged cache: split-KV decode, tiled prefill, append, rotary + append.

Where a key lives: position ``j`` of sequence ``b`` is slot ``j % block_size`` of block
``block_tables[b, j // block_size]``. A tile of ``BLOCK_N`` keys loads its table entries (a few
distinct ones: ``BLOCK_N / block_size`` pages) and then each key's (D) row from its page, so the
tile size is independent of the block size. Only the table entries of positions below the
sequence's length are loaded; a block id outside ``[0, num_blocks)`` is masked (its keys read as
zeros), so no load or store leaves the pools whatever the tables hold.

``decode`` (max_query_len <= 16): program (sequence x key/value head, split, row block) packs the
``group x max_query_len`` query rows of one key/value head into one tile, reads its slice of the
sequence once for all of them, and writes a normalized partial output and log-sum-exp to a float32
scratch; a second kernel merges the slices of each output row (with one split the first kernel
writes the output itself). Slices divide the sequence's length as read on the device.

``prefill``: program (query head x sequence, tile of BLOCK_M queries of that sequence) streams
its sequence's keys with an online softmax: whole tiles every row sees run unmasked, the causal
diagonal and the ragged end masked, tiles no row sees are skipped. Tiles past a sequence's own
query count return at once (the grid is sized by ``max_query_len``, a host int).

``append`` / ``rotary_append``: program (token, group of heads) finds its token's sequence by a
binary search over ``cu_seqlens`` (log2 B loads), then copies (or rotates) a (heads x D) tile into
the token's slot; a slot outside the table row or the pool is not written.

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

from ...runtime import alloc, pdl
from ...runtime.backends import triton_interpreting
from ...runtime.errors import kernel_dtype_reason
from ...runtime.launch import TritonLauncher, cdiv, next_power_of_2
from . import config
from .problem import AppendCall, AttentionCall, PagedProblem, RotaryAppendCall

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


@triton.jit
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
    n = tl.minimum(tl.maximum(tl.load(cu_ptr + b + 1).to(tl.int32) - first, 0), mq)
    tok = first + i
    row_ok = (r < rows) & (i < n) & (tok >= 0) & (tok < tokens)
    out_row = tok.to(tl.int64) * hq + head                     # row of the (T, Hq) output
    part = out_row * num_splits + split
    seqlen = tl.minimum(tl.maximum(tl.load(lens_ptr + b).to(tl.int32), 0), capacity)
    span = tl.maximum(tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N), 1) * BLOCK_N
    start = split * span
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    if start >= seqlen:   # a slice past this sequence's end: nothing to read
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


@triton.jit
def _combine_kernel(po_ptr, lse_off, o_ptr, num_splits, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    """Merge one output row's slices: weights 2^(lse - max), empty slices (lse = -inf) skipped."""
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    lse_row = po_ptr + lse_off + row * num_splits
    s_all = tl.arange(0, BLOCK_S)
    lse = tl.load(lse_row + s_all, mask=s_all < num_splits, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    total = tl.sum(w, axis=0)
    offs_d = tl.arange(0, BLOCK_D)
    used = lse > float("-inf")
    o = tl.load(po_ptr + (row * num_splits + s_all)[:, None] * D + offs_d[None, :],
                mask=used[:, None] & (offs_d < D)[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(o_ptr + row * D + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < D)


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, cu_ptr, o_ptr, tokens, hq, group, capacity,
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
    if pid_m * BLOCK_M < n:
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


@triton.jit
def _token_slot(tok, cu_ptr, lens_ptr, tables_ptr, batch, max_blocks, num_blocks, BS: tl.constexpr,
                LOG_B: tl.constexpr):
    """(cache position, flat slot block * BS + position % BS, writable) of packed token ``tok``:
    its sequence is the largest b with cu_seqlens[b] <= tok (binary search)."""
    lo = tok * 0
    hi = lo + batch - 1
    for _ in tl.static_range(LOG_B):
        mid = (lo + hi + 1) // 2
        go_up = tl.load(cu_ptr + mid).to(tl.int32) <= tok
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_up, hi, mid - 1)
    b = lo
    pos = tl.load(lens_ptr + b).to(tl.int32) + tok - tl.load(cu_ptr + b).to(tl.int32)
    col = pos // BS
    inside = (pos >= 0) & (col < max_blocks)
    blk = tl.load(tables_ptr + b.to(tl.int64) * max_blocks + tl.where(inside, col, 0), mask=inside, other=-1)
    ok = inside & (blk >= 0) & (blk < num_blocks)
    return pos, blk.to(tl.int64) * BS + (pos % BS), ok


@triton.jit
def _append_kernel(k_ptr, v_ptr, kp_ptr, vp_ptr, cu_ptr, lens_ptr, tables_ptr, batch, max_blocks, num_blocks, hkv,
                   k_st, k_sh, v_st, v_sh, kp_ss, kp_sh, vp_ss, vp_sh,
                   BS: tl.constexpr, LOG_B: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, HB: tl.constexpr,
                   PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    tok = tl.program_id(0)
    _, slot, ok = _token_slot(tok, cu_ptr, lens_ptr, tables_ptr, batch, max_blocks, num_blocks, BS, LOG_B)
    heads = (tl.program_id(1) * HB + tl.arange(0, HB)).to(tl.int64)
    d = tl.arange(0, D_P)
    m = ((heads < hkv) & ok)[:, None] & (d < D)[None, :]
    t64 = tok.to(tl.int64)
    x = tl.load(k_ptr + t64 * k_st + heads[:, None] * k_sh + d[None, :], mask=m)
    tl.store(kp_ptr + slot * kp_ss + heads[:, None] * kp_sh + d[None, :], x, mask=m)
    x = tl.load(v_ptr + t64 * v_st + heads[:, None] * v_sh + d[None, :], mask=m)
    tl.store(vp_ptr + slot * vp_ss + heads[:, None] * vp_sh + d[None, :], x, mask=m)


@triton.jit
def _rotate_store(x_ptr, o_ptr, x_row, o_row, heads, ok, c, sn, o_sh, x_sh, HALF, D,
                  HALF_P: tl.constexpr, TAIL_P: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr):
    """Rotate the heads of one token (x at x_row + h * x_sh) and store them at o_row + h * o_sh."""
    j = tl.arange(0, HALF_P)
    m = ok[:, None] & (j < HALF)[None, :]
    if INTERLEAVED:
        i1 = 2 * j
        i2 = 2 * j + 1
    else:
        i1 = j
        i2 = j + HALF
    xs = x_row + heads[:, None] * x_sh
    os = o_row + heads[:, None] * o_sh
    x1 = tl.load(x_ptr + xs + i1[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + xs + i2[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + os + i1[None, :], (x1 * c[None, :] - x2 * sn[None, :]).to(o_ptr.dtype.element_ty), mask=m)
    tl.store(o_ptr + os + i2[None, :], (x2 * c[None, :] + x1 * sn[None, :]).to(o_ptr.dtype.element_ty), mask=m)
    if COPY_TAIL:
        t = 2 * HALF + tl.arange(0, TAIL_P)
        tm = ok[:, None] & (t < D)[None, :]
        tail = tl.load(x_ptr + xs + t[None, :], mask=tm)
        tl.store(o_ptr + os + t[None, :], tail, mask=tm)


@triton.jit
def _rotary_append_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, kp_ptr, vp_ptr, cos_ptr, sin_ptr, pos_ptr, cu_ptr, lens_ptr,
                          tables_ptr, batch, max_blocks, num_blocks, hq, hkv, HALF, D, P, q_groups, k_groups,
                          q_st, q_sh, qo_st, qo_sh, k_st, k_sh, v_st, v_sh, kp_ss, kp_sh, vp_ss, vp_sh, c_s, s_s,
                          BS: tl.constexpr, LOG_B: tl.constexpr, HB: tl.constexpr, HALF_P: tl.constexpr,
                          TAIL_P: tl.constexpr, D_P: tl.constexpr, INTERLEAVED: tl.constexpr, Q_TAIL: tl.constexpr,
                          POS_GIVEN: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    tok = tl.program_id(0)
    grp = tl.program_id(1)
    cpos, slot, ok = _token_slot(tok, cu_ptr, lens_ptr, tables_ptr, batch, max_blocks, num_blocks, BS, LOG_B)
    t64 = tok.to(tl.int64)
    if grp < q_groups + k_groups:
        if POS_GIVEN:
            pos = tl.load(pos_ptr + tok).to(tl.int32)
        else:
            pos = cpos
        j = tl.arange(0, HALF_P)
        cm = (j < HALF) & (pos >= 0) & (pos < P)                  # outside the table: rotates to zeros
        c = tl.load(cos_ptr + pos.to(tl.int64) * c_s + j, mask=cm, other=0.0)
        sn = tl.load(sin_ptr + pos.to(tl.int64) * s_s + j, mask=cm, other=0.0)
        if grp < q_groups:
            heads = (grp * HB + tl.arange(0, HB)).to(tl.int64)
            _rotate_store(q_ptr, qo_ptr, t64 * q_st, t64 * qo_st, heads, heads < hq, c, sn, qo_sh, q_sh, HALF, D,
                          HALF_P, TAIL_P, INTERLEAVED, Q_TAIL)
        else:
            heads = ((grp - q_groups) * HB + tl.arange(0, HB)).to(tl.int64)
            _rotate_store(k_ptr, kp_ptr, t64 * k_st, slot * kp_ss, heads, (heads < hkv) & ok, c, sn, kp_sh, k_sh,
                          HALF, D, HALF_P, TAIL_P, INTERLEAVED, TAIL_P > 0)
    else:
        heads = ((grp - q_groups - k_groups) * HB + tl.arange(0, HB)).to(tl.int64)
        d = tl.arange(0, D_P)
        m = ((heads < hkv) & ok)[:, None] & (d < D)[None, :]
        x = tl.load(v_ptr + t64 * v_st + heads[:, None] * v_sh + d[None, :], mask=m)
        tl.store(vp_ptr + slot * vp_ss + heads[:, None] * vp_sh + d[None, :], x, mask=m)


_decode_split = TritonLauncher(_decode_split_kernel)
_combine = TritonLauncher(_combine_kernel)
_prefill = TritonLauncher(_prefill_kernel)
_append = TritonLauncher(_append_kernel)
_rotary_append = TritonLauncher(_rotary_append_kernel)


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


def _log_b(batch: int) -> int:
    """Binary-search steps that find one of ``batch`` sequences."""
    return max(batch - 1, 0).bit_length()


def launch_decode(call: AttentionCall, splits: Optional[int] = None) -> torch.Tensor:
    """Split-KV decode over the pages (split kernel, then merge unless one split); ``splits``
    overrides the count (tests, tuning)."""
    p = call.problem
    q, kp, vp = call.q, call.k_pages, call.v_pages
    out = alloc.empty((p.tokens, p.q_heads, p.head_dim), q.dtype, q.device)
    mq = p.max_query_len
    rows = p.group * mq
    br, bn, nw, ns = config.decode_config(p.head_dim, q.element_size(), rows, triton_interpreting())
    row_blocks = cdiv(rows, br)
    if splits is None:
        splits = config.decode_splits(p.batch, p.kv_heads, row_blocks, p.capacity, _sms(q), bn)
    splits = max(1, min(splits, config.MAX_SPLITS, cdiv(max(p.capacity, 1), bn)))
    n_rows = p.tokens * p.q_heads
    direct = splits == 1
    if direct:
        part, lse_off = out, 0
    else:   # one scratch: partial outputs, then their log-sum-exps
        lse_off = n_rows * splits * p.head_dim
        part = torch.empty((lse_off + n_rows * splits,), dtype=torch.float32, device=q.device)
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
        block_s = max(16, next_power_of_2(splits))
        warps = 1 if block_d <= 64 else 2 if block_d <= 128 else 4
        _combine((n_rows,), (part, lse_off, out, splits, p.head_dim, block_d, block_s, dependent),
                 num_warps=warps, num_stages=2)
    return out


def launch_prefill(call: AttentionCall, block_m: Optional[int] = None, block_n: Optional[int] = None,
                   num_warps: Optional[int] = None, num_stages: Optional[int] = None) -> torch.Tensor:
    """The tiled prefill kernel over the pages; keyword arguments override its configuration."""
    p = call.problem
    q, kp, vp = call.q, call.k_pages, call.v_pages
    out = alloc.empty((p.tokens, p.q_heads, p.head_dim), q.dtype, q.device)
    cfg = config.prefill_config(p.head_dim, q.element_size(), triton_interpreting())
    bm, bn, nw, ns = (block_m or cfg[0], block_n or cfg[1], num_warps or cfg[2], num_stages or cfg[3])
    dot_f32, ieee = _dot_flags(q.dtype)
    grid = (p.batch * p.q_heads, cdiv(p.max_query_len, bm))
    _prefill(grid, (q, kp, vp, call.block_tables, call.cache_seqlens, call.cu_seqlens, out, p.tokens, p.q_heads,
                    p.group, p.capacity, p.max_blocks, p.num_blocks, call.scale * LOG2E,
                    q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), kp.stride(2),
                    vp.stride(0), vp.stride(1), vp.stride(2), out.stride(0), out.stride(1),
                    p.block_size, p.head_dim, config.head_block(p.head_dim), bm, bn, dot_f32, ieee, call.scale > 0,
                    pdl.on(q.device)),
            num_warps=nw, num_stages=ns)
    return out


def launch_attention(call: AttentionCall) -> torch.Tensor:
    """The decode kernel for few new tokens per sequence, the prefill kernel otherwise."""
    return launch_decode(call) if call.problem.decode else launch_prefill(call)


def launch_append(call: AppendCall) -> None:
    p = call.problem
    k, v, kp, vp = call.k, call.v, call.k_pages, call.v_pages
    hb = config.append_heads(p.kv_heads, p.head_dim)
    d_p = next_power_of_2(p.head_dim)
    _append((p.tokens, cdiv(p.kv_heads, hb)),
            (k, v, kp, vp, call.cu_seqlens, call.cache_seqlens, call.block_tables, p.batch, p.max_blocks,
             p.num_blocks, p.kv_heads, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
             kp.stride(1), kp.stride(2), vp.stride(1), vp.stride(2),
             p.block_size, _log_b(p.batch), p.head_dim, d_p, hb, pdl.on(k.device)),
            num_warps=4 if hb * d_p >= 2048 else 2 if hb * d_p >= 512 else 1, num_stages=1)
    return None


def launch_rotary_append(call: RotaryAppendCall) -> torch.Tensor:
    p = call.problem
    app = call.app
    q, k, v, kp, vp = call.q, app.k, app.v, app.k_pages, app.v_pages
    q_out = q if call.inplace else alloc.empty((p.tokens, p.q_heads, p.head_dim), q.dtype, q.device)
    half = p.rotary_dim // 2
    tail = p.head_dim - p.rotary_dim
    hb = config.append_heads(max(p.q_heads, p.kv_heads), p.head_dim)
    q_groups, k_groups = cdiv(p.q_heads, hb), cdiv(p.kv_heads, hb)
    pos = call.positions if call.positions is not None else app.cache_seqlens   # an unread stand-in
    width = hb * next_power_of_2(p.head_dim)
    _rotary_append((p.tokens, q_groups + 2 * k_groups),
                   (q, k, v, q_out, kp, vp, call.cos, call.sin, pos, app.cu_seqlens, app.cache_seqlens,
                    app.block_tables, p.batch, p.max_blocks, p.num_blocks, p.q_heads, p.kv_heads, half, p.head_dim,
                    call.cos.shape[0], q_groups, k_groups, q.stride(0), q.stride(1), q_out.stride(0),
                    q_out.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), kp.stride(1), kp.stride(2),
                    vp.stride(1), vp.stride(2), call.cos.stride(0), call.sin.stride(0),
                    p.block_size, _log_b(p.batch), hb, next_power_of_2(half), next_power_of_2(tail) if tail else 0,
                    next_power_of_2(p.head_dim), p.interleaved, tail > 0 and not call.inplace,
                    call.positions is not None, pdl.on(q.device)),
                   num_warps=4 if width >= 2048 else 2 if width >= 512 else 1, num_stages=1)
    return q_out


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
        ("prefill", _reason, launch_prefill,
         "tiled flash attention over pages: Q tile per sequence vs streamed key tiles, causal tiles skipped"),
    ),
    "paged_kv_cache_append": (
        ("scatter", _reason, launch_append, "one program per token: its (heads x D) rows into its slot"),
    ),
    "paged_rotary_kv_cache_append": (
        ("fused", _reason, launch_rotary_append,
         "rotate q and k and write k, v into their slots in one launch (the rotated k never goes through memory)"),
    ),
}
