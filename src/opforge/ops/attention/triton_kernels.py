"""Triton kernels for attention (prefill) and decode_attention (split-KV flash decoding).

``prefill``: one program per (tile of BLOCK_M queries, batch x query head). It keeps its Q tile
in registers and streams the K/V tiles of its key/value head (query head h reads key/value head
h // group: grouped-query attention by head mapping, no repeat), with an online softmax in
float32: a running row maximum and a sum rescaled to it, exponentials in base 2 with the scale
folded in. The key range splits into tiles every query row of the tile sees in full (no mask)
and the causal diagonal / ragged end (masked); tiles no row sees are never visited. Programs
with the most causal work start first. A row that sees no key gives zeros. On GPUs of compute
capability 9.0 and newer (Hopper's TMA copy engine), float16 / bfloat16 with D = 64 or 128,
16-byte aligned tensors and calls of 4e10 FLOPs or more, the same kernel reads Q, K and V through
(B, H, S, D) tensor descriptors (``tma_reason`` says why it does not); the copy engine fills rows
past a sequence's end with zeros.

``decode``: split-KV. Program (batch b, key/value head, split, row block) reads its slice of
the cache once for all ``group * Sq`` query rows of that head group, packed into one tile so the
scores are a ``tl.dot``; it writes the slice's normalized partial output and log-sum-exp to a
float32 scratch. A second kernel merges a row's partials (with one split, the split kernel writes
the output itself and no merge runs). Lengths are read on the device only
(clamped to [0, S_max]); a split past its sequence's length stores a log-sum-exp of -inf and
reads nothing. Shapes of the grid and scratch depend on host-known sizes only, so a call is capturable
in a CUDA graph and replays with new lengths.

Head dimensions up to 256 run; the D block is padded to a power of two (>= 16) with masks.
float16 / bfloat16 multiply in their precision with float32 accumulation; float32 inputs use
IEEE float32 dots. Under ``TRITON_INTERPRET=1`` operands are cast to float32 (the interpreter's
bf16 dot is wrong) and tiles are 16 wide so small tests cross tile boundaries.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.triton.arch import nvidia_sm90_or_newer
from ...runtime.backends import triton_interpreting
from ...runtime.errors import kernel_dtype_reason
from ...runtime.triton.launch import TritonLauncher, cdiv, int_spec
from .config import (MAX_SPLITS, PREFILL_TMA_HEAD_DIMS, PREFILL_TMA_MIN_FLOPS, causal_small_tiles, decode_config,
                     decode_splits_by_length, head_block, prefill_config)
from .problem import MAX_KERNEL_HEAD_DIM, AttentionCall, AttentionProblem, DecodeCall

LOG2E = 1.4426950408889634


@triton.jit
def _kv_tile(k_base, v_base, k_ss, v_ss, start_n, offs_n, offs_d, d_ok, end_n, MASKED: tl.constexpr,
             PAD_D: tl.constexpr):
    """The K and V tiles of keys start_n .. start_n + BLOCK_N by pointers (keys >= end_n and
    padded D columns read as zeros where MASKED / PAD_D)."""
    k_ptrs = k_base + tl.cast(start_n, tl.int64) * k_ss + offs_n[:, None] * k_ss + offs_d[None, :]
    v_ptrs = v_base + tl.cast(start_n, tl.int64) * v_ss + offs_n[:, None] * v_ss + offs_d[None, :]
    if MASKED or PAD_D:
        kv_mask = ((start_n + offs_n) < end_n)[:, None] & d_ok[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    return k, v


@triton.jit
def _softmax_step(acc, m_i, l_i, q, k, v, cols, offs_m, end_n, shift, qk_scale, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr, FUSE_SCALE: tl.constexpr):
    """One K/V tile (keys ``cols``) into the running (acc, max, sum) of every query row; keys >=
    end_n are masked, and with CAUSAL key j is seen by row i only if j <= i + shift (MASKED tiles
    only)."""
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if FUSE_SCALE and not MASKED:
        # scale > 0: the row maximum of the raw scores, scaled, is the maximum of the scaled ones,
        # so the scale and the subtraction become one FMA per score
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    else:
        s = s * qk_scale
        if MASKED:
            ok = (cols < end_n)[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= offs_m[:, None] + shift)
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MASKED:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet stays empty
        else:
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
def _attend_tile(acc, m_i, l_i, q, k_base, v_base, k_ss, v_ss, start_n, offs_m, offs_n, offs_d, d_ok, end_n,
                 shift, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                 DOT_F32: tl.constexpr, IEEE: tl.constexpr, FUSE_SCALE: tl.constexpr):
    """``_softmax_step`` over the K/V tile of keys start_n .. start_n + BLOCK_N, read by pointers."""
    k, v = _kv_tile(k_base, v_base, k_ss, v_ss, start_n, offs_n, offs_d, d_ok, end_n, MASKED, PAD_D)
    return _softmax_step(acc, m_i, l_i, q, k, v, start_n + offs_n, offs_m, end_n, shift, qk_scale, MASKED, CAUSAL,
                         DOT_F32, IEEE, FUSE_SCALE)


@triton.jit
def _prefill_tile(acc, m_i, l_i, q, k_src, v_src, b, kvh, k_ss, v_ss, start_n, offs_m, offs_n, offs_d, d_ok, end_n,
                  shift, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                  DOT_F32: tl.constexpr, IEEE: tl.constexpr, FUSE_SCALE: tl.constexpr, TMA: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One prefill K/V tile: through tensor descriptors (TMA; rows past the keys' end read as
    zeros, and the mask covers them) or through pointers from the (b, kvh) bases ``k_src``/``v_src``."""
    if TMA:
        k = k_src.load([b, kvh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = v_src.load([b, kvh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        k, v = _kv_tile(k_src, v_src, k_ss, v_ss, start_n, offs_n, offs_d, d_ok, end_n, MASKED, PAD_D)
    return _softmax_step(acc, m_i, l_i, q, k, v, start_n + offs_n, offs_m, end_n, shift, qk_scale, MASKED, CAUSAL,
                         DOT_F32, IEEE, FUSE_SCALE)


@triton.jit
def _prefill_kernel(o_ptr, q_src, k_src, v_src, sq, sk, hq, group, qk_scale,
                    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr,
                    SCALE_POS: tl.constexpr, TMA: tl.constexpr):
    # TMA: q_src / k_src / v_src are (B, H, S, D) tensor descriptors; otherwise pointers
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)   # the longest causal rows first
    bh = tl.program_id(1)
    b = bh // hq
    h = bh % hq
    kvh = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_ok = offs_m < sq
    if TMA:
        q = q_src.load([b, h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_D)
        k_at = k_src
        v_at = v_src
    else:
        q_base = q_src + b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh
        q = tl.load(q_base + offs_m.to(tl.int64)[:, None] * q_ss + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        k_at = k_src + b.to(tl.int64) * k_sb + kvh.to(tl.int64) * k_sh
        v_at = v_src + b.to(tl.int64) * v_sb + kvh.to(tl.int64) * v_sh
    if DOT_F32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    shift = sk - sq
    if CAUSAL:
        hi = tl.maximum(tl.minimum(sk, (pid_m + 1) * BLOCK_M + shift), 0)          # no row sees keys >= hi
        full = tl.maximum(tl.minimum(sk, pid_m * BLOCK_M + shift + 1), 0)         # every row sees keys < full
    else:
        hi = sk
        full = sk
    full = (full // BLOCK_N) * BLOCK_N
    for start_n in range(0, full, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_at, v_at, b, kvh, k_ss, v_ss, start_n, offs_m, offs_n,
                                      offs_d, d_ok, sk, shift, qk_scale, False, CAUSAL, PAD_D, DOT_F32, IEEE,
                                      SCALE_POS, TMA, BLOCK_N, BLOCK_D)
    for start_n in range(full, hi, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_at, v_at, b, kvh, k_ss, v_ss, start_n, offs_m, offs_n,
                                      offs_d, d_ok, sk, shift, qk_scale, True, CAUSAL, PAD_D, DOT_F32, IEEE,
                                      False, TMA, BLOCK_N, BLOCK_D)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]                               # no key seen: zeros
    o_base = o_ptr + b.to(tl.int64) * o_sb + h.to(tl.int64) * o_sh
    tl.store(o_base + offs_m.to(tl.int64)[:, None] * o_ss + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, lens_ptr, po_ptr, lse_off, o_ptr, hkv, hq, sq, rows, s_max,
                         split_len, num_splits, qk_scale, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                         D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                         DOT_F32: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr, PAD_D: tl.constexpr,
                         BY_LENGTH: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # DIRECT (one split): write the final output, no partials and no merge kernel. The partials'
    # log-sum-exps follow their outputs in one float32 scratch: po_ptr + lse_off. BY_LENGTH: the
    # slices divide the tokens in the cache (read on the device), not its capacity (split_len).
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // hkv
    kvh = bk % hkv
    group = rows // sq
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)   # packed query row: r = g * Sq + i
    row_ok = r < rows
    g = r // sq
    i = r % sq
    head = kvh * group + g
    out_row = (b * hq + head).to(tl.int64) * sq + i            # row of the (B, Hq, Sq) output
    part = out_row * num_splits + split
    seqlen = tl.minimum(tl.maximum(tl.load(lens_ptr + b).to(tl.int32), 0), s_max)
    if BY_LENGTH:
        span = tl.maximum(tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N), 1) * BLOCK_N
    else:
        span = split_len
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
        q_ptrs = q_ptr + b.to(tl.int64) * q_sb + head.to(tl.int64)[:, None] * q_sh + i.to(tl.int64)[:, None] * q_ss \
            + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        k_base = k_ptr + b.to(tl.int64) * k_sb + kvh.to(tl.int64) * k_sh
        v_base = v_ptr + b.to(tl.int64) * v_sb + kvh.to(tl.int64) * v_sh
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        # row i sees keys j <= seqlen - Sq + i: in the prefill helper's terms, shift = seqlen - Sq.
        # Whole tiles below every row's limit (keys < seqlen - Sq + 1) run without masks.
        full = start + tl.maximum(tl.minimum(end, seqlen - sq + 1) - start, 0) // BLOCK_N * BLOCK_N
        for start_n in range(start, full, BLOCK_N):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_base, v_base, k_ss, v_ss, start_n, i, offs_n, offs_d,
                                         d_ok, end, seqlen - sq, qk_scale, False, True, PAD_D, DOT_F32, IEEE, False)
        for start_n in range(full, end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_base, v_base, k_ss, v_ss, start_n, i, offs_n, offs_d,
                                         d_ok, end, seqlen - sq, qk_scale, True, True, True, DOT_F32, IEEE, False)
        seen = l_i > 0.0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        if DIRECT:
            tl.store(o_ptr + out_row[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])
        else:
            tl.store(po_ptr + lse_off + part, lse, mask=row_ok)
            tl.store(po_ptr + part[:, None] * D + offs_d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _decode_combine_kernel(po_ptr, lse_off, o_ptr, num_splits, D: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_S: tl.constexpr, CHUNK_S: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    plse_ptr = po_ptr + lse_off
    s_all = tl.arange(0, BLOCK_S)
    lse = tl.load(plse_ptr + row * num_splits + s_all, mask=s_all < num_splits, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp2(lse - m), axis=0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    acc = tl.zeros([BLOCK_D], tl.float32)
    for c in range(0, num_splits, CHUNK_S):
        s = c + tl.arange(0, CHUNK_S)
        lse_c = tl.load(plse_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
        used = lse_c > float("-inf")             # a split past the sequence wrote no partial output
        o = tl.load(po_ptr + (row * num_splits + s)[:, None] * D + offs_d[None, :],
                    mask=used[:, None] & d_ok[None, :], other=0.0)
        acc += tl.sum(tl.exp2(lse_c - m)[:, None] * o, axis=0)
    out = acc / tl.where(total == 0.0, 1.0, total)
    tl.store(o_ptr + row * D + offs_d, out.to(o_ptr.dtype.element_ty), mask=d_ok)


_prefill = TritonLauncher(_prefill_kernel)
_decode_split = TritonLauncher(_decode_split_kernel)
_decode_combine = TritonLauncher(_decode_combine_kernel)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: Optional[int]) -> int:
    """Multiprocessors of a CUDA device; a small stand-in under the interpreter (CPU tensors)."""
    if device_index is None or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sms(t: torch.Tensor) -> int:
    return sm_count(t.device.index if t.device.type == "cuda" else None)


def _dot_flags(dtype: torch.dtype) -> tuple[bool, bool]:
    """(DOT_F32, IEEE): cast operands to float32 under the interpreter; float32 dots in IEEE."""
    return triton_interpreting(), dtype == torch.float32


def tma_reason(call: AttentionCall) -> Optional[str]:
    """Why the prefill kernel reads q, k and v by pointers rather than through tensor descriptors
    (Hopper's TMA copies), or None when it uses descriptors: on a GPU of compute capability 9.0
    or newer, for float16 / bfloat16 with a head dimension measured there (``PREFILL_TMA_HEAD_DIMS``),
    with 16-byte aligned tensors and strides, for calls of ``PREFILL_TMA_MIN_FLOPS`` or more.

    Example:
        >>> import torch
        >>> from opforge.ops.attention.problem import prepare_attention
        >>> q = torch.randn(1, 2, 8, 64)
        >>> tma_reason(prepare_attention(q, q, q, False, None))
        'q is not on a CUDA device'
    """
    p = call.problem
    q = call.q
    if q.device.type != "cuda":
        return "q is not on a CUDA device"
    if not nvidia_sm90_or_newer(q.device.index):
        return "the GPU has no TMA (not an NVIDIA GPU of compute capability >= 9.0)"
    if p.dtype not in (torch.float16, torch.bfloat16):
        return f"{p.dtype} (descriptors: float16 / bfloat16)"
    if p.head_dim not in PREFILL_TMA_HEAD_DIMS:
        return f"head_dim {p.head_dim} (descriptors: {PREFILL_TMA_HEAD_DIMS})"
    flops = 4 * p.batch * p.q_heads * p.q_len * p.kv_len * p.head_dim / (2 if p.causal else 1)
    if flops < PREFILL_TMA_MIN_FLOPS:
        return f"{flops:.1e} FLOPs: building descriptors costs more host time than they save below " \
               f"{PREFILL_TMA_MIN_FLOPS:.0e}"
    for name, t in (("q", q), ("k", call.k), ("v", call.v)):
        if t.data_ptr() % 16 or any(st * t.element_size() % 16 for st in _descriptor_strides(t)[:3]):
            return f"{name} is not 16-byte aligned in its address or strides"
    return None


def _descriptor_strides(t: torch.Tensor) -> list[int]:
    """``t``'s strides with those of size-1 dimensions (never used to address) replaced by the packed
    stride, which is 16-byte aligned whenever the dimension inside it is."""
    strides = list(t.stride())
    for i in range(t.dim() - 2, -1, -1):
        if t.shape[i] == 1:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    return strides


def _descriptor(t: torch.Tensor, rows: int):
    """A (B, H, S, D) tensor descriptor whose block is ``rows`` positions of one head."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), _descriptor_strides(t), [1, 1, rows, t.shape[3]])


def launch_prefill(call: AttentionCall, block_m: Optional[int] = None, block_n: Optional[int] = None,
                   num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                   tma: Optional[bool] = None) -> torch.Tensor:
    """Run the prefill kernel; the keyword arguments override its configuration (for tuning and
    tests: ``tma`` forces descriptors or pointers, where the default follows ``tma_reason``)."""
    p = call.problem
    q, k, v = call.q, call.k, call.v
    out = alloc.empty((p.batch, p.q_heads, p.q_len, p.head_dim), q.dtype, q.device)
    if out.numel() == 0:
        return out
    if tma is None:
        tma = tma_reason(call) is None
    cfg = prefill_config(p.head_dim, q.element_size(), triton_interpreting(), tma,
                         causal_small_tiles(p.head_dim, p.kv_len) if call.causal else False)
    bm, bn, nw, ns = (block_m or cfg[0], block_n or cfg[1], num_warps or cfg[2], num_stages or cfg[3])
    dot_f32, ieee = _dot_flags(q.dtype)
    srcs = (_descriptor(q, bm), _descriptor(k, bn), _descriptor(v, bn)) if tma else (q, k, v)
    grid = (cdiv(p.q_len, bm), p.batch * p.q_heads)
    _prefill(grid, (out, *srcs, p.q_len, p.kv_len, p.q_heads, p.group, call.scale * LOG2E,
                    q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                    v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                    p.head_dim, head_block(p.head_dim), head_block(p.head_dim) != p.head_dim, bm, bn, call.causal,
                    dot_f32, ieee, call.scale > 0, tma),
             num_warps=nw, num_stages=ns)
    return out


def launch_decode(call: DecodeCall, splits: Optional[int] = None, block_n: Optional[int] = None,
                  num_warps: Optional[int] = None, num_stages: Optional[int] = None) -> torch.Tensor:
    """Run split-KV decoding (split kernel + combine kernel); keyword arguments override the
    configuration (for tuning). Never reads ``cache_seqlens`` on the host: ``split_len`` bounds
    the capacity, and the kernel divides each sequence's length among the slices."""
    p = call.problem
    q, k, v = call.q, call.k_cache, call.v_cache
    out = alloc.empty((p.batch, p.q_heads, p.q_len, p.head_dim), q.dtype, q.device)
    if out.numel() == 0:
        return out
    if p.kv_len == 0:
        return out.zero_()
    rows = p.group * p.q_len
    br, bn, nw, ns = decode_config(p.head_dim, q.element_size(), rows, triton_interpreting())
    bn, nw, ns = block_n or bn, num_warps or nw, num_stages or ns
    row_blocks = cdiv(rows, br)
    if splits is None:
        splits = decode_splits_by_length(p.batch, p.kv_heads, row_blocks, p.kv_len, _sms(q), bn)
    splits = max(1, min(splits, MAX_SPLITS, cdiv(p.kv_len, bn)))
    split_len = cdiv(cdiv(p.kv_len, splits), bn) * bn
    n_rows = p.batch * p.q_heads * p.q_len
    direct = splits == 1
    if direct:   # the split kernel writes the output itself
        part, lse_off = out, 0
    else:        # one allocation: partial outputs, then their log-sum-exps
        lse_off = n_rows * splits * p.head_dim
        part = torch.empty((lse_off + n_rows * splits,), dtype=torch.float32, device=q.device)
    dot_f32, ieee = _dot_flags(q.dtype)
    block_d = head_block(p.head_dim)
    lens = call.cache_seqlens
    tensors = (q, k, v, lens, part, out)
    ints = (lse_off, p.kv_heads, p.q_heads, p.q_len, rows, p.kv_len, split_len, splits, *q.stride()[:3],
            *k.stride()[:3], *v.stride()[:3])
    dependent = pdl.on(q.device)
    consts = (p.head_dim, block_d, br, bn, dot_f32, ieee, direct, block_d != p.head_dim, not direct,
              dependent)
    # what Triton specializes on (dtypes, 16-byte alignment, each int's class, constexprs): computing
    # the generic key over 30 arguments costs more host time than the kernel takes at short contexts
    key = (q.get_device(), q.dtype, lens.dtype, part.dtype) + tuple(t.data_ptr() & 15 for t in tensors) + \
        tuple(map(int_spec, ints)) + consts + (nw, ns)
    _decode_split((p.batch * p.kv_heads, splits, row_blocks),
                  (q, k, v, lens, part, ints[0], out, *ints[1:8], call.scale * LOG2E, *ints[8:], *consts),
                  num_warps=nw, num_stages=ns, key=key)
    if not direct:
        block_s = 16 if splits <= 16 else MAX_SPLITS    # two compiled variants, whatever the split count
        warps = 1 if block_d <= 64 else 2 if block_d <= 128 else 4
        consts = (p.head_dim, block_d, block_s, 16, dependent)
        key = (q.get_device(), q.dtype, part.data_ptr() & 15, out.data_ptr() & 15, int_spec(lse_off),
               int_spec(splits)) + consts + (warps,)
        _decode_combine((n_rows,), (part, lse_off, out, splits, *consts), num_warps=warps, num_stages=2, key=key)
    return out


def _reason(p: AttentionProblem) -> Optional[str]:
    reason = kernel_dtype_reason("triton", p.dtype, "q")
    if reason:
        return reason
    if p.head_dim > MAX_KERNEL_HEAD_DIM:
        return f"head_dim {p.head_dim} > {MAX_KERNEL_HEAD_DIM}"
    return None


VARIANTS = {
    "attention": (
        ("prefill", _reason, launch_prefill,
         "flash attention: Q tile vs streamed K/V tiles (TMA tensor descriptors on compute capability >= 9.0), "
         "online softmax, causal tiles skipped"),
    ),
    "decode_attention": (
        ("split_kv", _reason, launch_decode,
         "split-KV flash decoding: each cache slice read once per head group, partials merged"),
    ),
}
