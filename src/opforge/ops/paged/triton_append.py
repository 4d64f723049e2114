"""Triton kernels of paged_kv_cache_append and paged_rotary_kv_cache_append.

Program (token, group of heads) finds its token's sequence by a binary search over
``cu_seqlens`` (log2 B loads), its cache position ``cache_seqlens[b] + i`` and the slot of that
position in the sequence's block, then copies (append) or rotates (rotary append: q into a new
tensor or in place, k into the slot; v copied) a (heads x D) tile. A slot outside the table row,
or a block id outside the pool, is not written; a rotary position outside the cos/sin table
rotates to zeros. No host read of a device tensor: capturable in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.triton.launch import TritonLauncher, cdiv, next_power_of_2
from . import config
from .problem import AppendCall, RotaryAppendCall


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


@triton.jit(do_not_specialize=["batch", "max_blocks"])
def _append_kernel(k_ptr, v_ptr, kp_ptr, vp_ptr, cu_ptr, lens_ptr, tables_ptr, batch, max_blocks, num_blocks, hkv,
                   k_st, k_sh, v_st, v_sh, kp_ss, kp_sh, vp_ss, vp_sh,
                   BS: tl.constexpr, LOG_B: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, HB: tl.constexpr,
                   PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    tok = tl.program_id(0)
    _, slot, ok = _token_slot(tok, cu_ptr, lens_ptr, tables_ptr, batch, max_blocks, num_blocks, BS, LOG_B)
    heads = (tl.program_id(1) * HB + tl.arange(0, HB)).to(tl.int64)
    d = tl.arange(0, D_P)
    m = tl.where(ok, heads < hkv, False)[:, None] & (d < D)[None, :]   # where, not &: scalar & tensor is not bool in Triton 3.9's interpreter
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


@triton.jit(do_not_specialize=["batch", "max_blocks"])
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
        cm = tl.where((pos >= 0) & (pos < P), j < HALF, False)   # outside the table: rotates to zeros
        c = tl.load(cos_ptr + pos.to(tl.int64) * c_s + j, mask=cm, other=0.0)
        sn = tl.load(sin_ptr + pos.to(tl.int64) * s_s + j, mask=cm, other=0.0)
        if grp < q_groups:
            heads = (grp * HB + tl.arange(0, HB)).to(tl.int64)
            _rotate_store(q_ptr, qo_ptr, t64 * q_st, t64 * qo_st, heads, heads < hq, c, sn, qo_sh, q_sh, HALF, D,
                          HALF_P, TAIL_P, INTERLEAVED, Q_TAIL)
        else:
            heads = ((grp - q_groups) * HB + tl.arange(0, HB)).to(tl.int64)
            _rotate_store(k_ptr, kp_ptr, t64 * k_st, slot * kp_ss, heads, tl.where(ok, heads < hkv, False), c, sn, kp_sh, k_sh,
                          HALF, D, HALF_P, TAIL_P, INTERLEAVED, TAIL_P > 0)
    else:
        heads = ((grp - q_groups - k_groups) * HB + tl.arange(0, HB)).to(tl.int64)
        d = tl.arange(0, D_P)
        m = tl.where(ok, heads < hkv, False)[:, None] & (d < D)[None, :]   # where, not &: scalar & tensor is not bool in Triton 3.9's interpreter
        x = tl.load(v_ptr + t64 * v_st + heads[:, None] * v_sh + d[None, :], mask=m)
        tl.store(vp_ptr + slot * vp_ss + heads[:, None] * vp_sh + d[None, :], x, mask=m)


_append = TritonLauncher(_append_kernel)
_rotary_append = TritonLauncher(_rotary_append_kernel)


def _log_b(batch: int) -> int:
    """Binary-search steps that find one of ``batch`` sequences, rounded up to a multiple of 4 (at
    least 4): the step count is a compile-time constant, and a search with spare steps ends where
    it stood, so batches of 1..16, 17..256, 257..4096 sequences share one compiled kernel each.

    Example:
        >>> [_log_b(b) for b in (1, 2, 16, 17, 256, 257)]
        [4, 4, 4, 8, 8, 12]
    """
    return max(4, -(-max(batch - 1, 0).bit_length() // 4) * 4)


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
