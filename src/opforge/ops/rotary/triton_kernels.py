"""Triton kernels for rotary_embedding and kv_cache_append.

``rotary``: one launch rotates q and k. Program (token, group) loads the token's position and
its cos/sin rows once, then rotates a block of heads of q (the first groups) or of k (the
rest) as a (heads x R/2) tile: the two halves of each pair are loaded, rotated in float32 and
stored in the output dtype. Rotate-half and interleaved differ only in the pair offsets,
(i, i + R/2) or (2i, 2i + 1). Features R..D-1 are copied when the output is a new tensor and
left alone in place. q and k are read through their strides (a transposed (B, S, H, D) buffer
viewed as (B, H, S, D) runs without a copy).

A position outside ``[0, max_positions)`` is masked: cos and sin load as zero, so the rotated
features of that token are written as 0 (visible, and no out-of-bounds read). No host sync.

``kv_append``: program (token, group) reads ``cache_seqlens[b]`` and copies a block of heads of
k and v into the caches at position ``cache_seqlens[b] + s``; a position outside
``[0, S_max)`` is not written (the write is masked), so a bad length can never corrupt memory,
even inside a CUDA graph where the host check is off.
"""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from ...runtime.errors import kernel_dtype_reason
from ...runtime.triton.launch import TritonLauncher, cdiv, int_spec, next_power_of_2
from .problem import AppendCall, FusedCall, RotaryCall, RotaryProblem
from ...runtime import alloc, plans
from ...runtime.triton import pdl
from ...runtime.lru import LRU

TILE = 4096          # elements per (heads x features) tile of one program
NUM_WARPS: Optional[int] = None   # None: from the tile size; an int overrides it (tuning sweeps)
MAX_HEAD_DIM = 16384


@triton.jit
def _rotate_heads(x_ptr, o_ptr, c, sn, x_base, o_base, ok, h0, H, sxh, soh, HALF, D,
                  HB: tl.constexpr, HALF_P: tl.constexpr, TAIL_P: tl.constexpr,
                  INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr):
    """Rotate heads h0 .. h0 + HB - 1 of one token: x at x_base + h * sxh, out at o_base + h * soh
    (written only where the scalar ``ok`` holds)."""
    heads = h0 + tl.arange(0, HB)
    hm = tl.where(ok, heads < H, False)   # where, not &: a scalar & a tensor of bool is not bool in every interpreter
    heads64 = heads.to(tl.int64)
    xrow = x_base + heads64[:, None] * sxh
    orow = o_base + heads64[:, None] * soh
    if INTERLEAVED:
        # pairs (2i, 2i + 1): one contiguous load of the R features, split into even and odd
        # (strided half-width loads would not vectorize), joined back for one contiguous store
        j = tl.arange(0, 2 * HALF_P)
        mj = hm[:, None] & (j < 2 * HALF)[None, :]
        x = tl.load(x_ptr + xrow + j[None, :], mask=mj, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (HB, HALF_P, 2)))
        o1 = x1 * c[None, :] - x2 * sn[None, :]
        o2 = x2 * c[None, :] + x1 * sn[None, :]
        o = tl.reshape(tl.join(o1, o2), (HB, 2 * HALF_P))
        tl.store(o_ptr + orow + j[None, :], o.to(o_ptr.dtype.element_ty), mask=mj)
    else:
        i = tl.arange(0, HALF_P)
        m = hm[:, None] & (i < HALF)[None, :]
        x1 = tl.load(x_ptr + xrow + i[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + xrow + (i + HALF)[None, :], mask=m, other=0.0).to(tl.float32)
        o1 = x1 * c[None, :] - x2 * sn[None, :]
        o2 = x2 * c[None, :] + x1 * sn[None, :]
        tl.store(o_ptr + orow + i[None, :], o1.to(o_ptr.dtype.element_ty), mask=m)
        tl.store(o_ptr + orow + (i + HALF)[None, :], o2.to(o_ptr.dtype.element_ty), mask=m)
    if COPY_TAIL:
        j = 2 * HALF + tl.arange(0, TAIL_P)
        tm = hm[:, None] & (j < D)[None, :]
        tail = tl.load(x_ptr + xrow + j[None, :], mask=tm, other=0.0)
        tl.store(o_ptr + orow + j[None, :], tail.to(o_ptr.dtype.element_ty), mask=tm)


@triton.jit
def _angles(cos_ptr, sin_ptr, pos, P, scos, ssin, HALF, HALF_P: tl.constexpr):
    """The cos and sin rows of ``pos``; zeros (and no read) outside [0, P)."""
    i = tl.arange(0, HALF_P)
    cm = tl.where((pos >= 0) & (pos < P), i < HALF, False)
    c = tl.load(cos_ptr + pos * scos + i, mask=cm, other=0.0)
    sn = tl.load(sin_ptr + pos * ssin + i, mask=cm, other=0.0)
    return c, sn


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr,
                   S, Hq, Hkv, HALF, D, P, spb, sps, scos, ssin,
                   sqb, sqh, sqs, sqob, sqoh, sqos, skb, skh, sks, skob, skoh, skos, q_groups,
                   HBQ: tl.constexpr, HBK: tl.constexpr, HALF_P: tl.constexpr, TAIL_P: tl.constexpr,
                   INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    tok = tl.program_id(0)
    g = tl.program_id(1)
    b = (tok // S).to(tl.int64)
    s = (tok % S).to(tl.int64)
    pos = tl.load(pos_ptr + (b * spb + s * sps)).to(tl.int64)
    c, sn = _angles(cos_ptr, sin_ptr, pos, P, scos, ssin, HALF, HALF_P)
    if g < q_groups:
        _rotate_heads(q_ptr, qo_ptr, c, sn, b * sqb + s * sqs, b * sqob + s * sqos, b >= 0, g * HBQ, Hq, sqh, sqoh,
                      HALF, D, HBQ, HALF_P, TAIL_P, INTERLEAVED, COPY_TAIL)
    else:
        _rotate_heads(k_ptr, ko_ptr, c, sn, b * skb + s * sks, b * skob + s * skos, b >= 0, (g - q_groups) * HBK,
                      Hkv, skh, skoh, HALF, D, HBK, HALF_P, TAIL_P, INTERLEAVED, COPY_TAIL)


@triton.jit
def _rotary_append_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pos_ptr, len_ptr,
                          S, Hq, Hkv, HALF, D, P, S_max, spb, sps, slen, scos, ssin,
                          sqb, sqh, sqs, sqob, sqoh, sqos, skb, skh, sks, svb, svh, svs,
                          skcb, skch, skcs, svcb, svch, svcs, q_groups, k_groups,
                          HBQ: tl.constexpr, HBK: tl.constexpr, HALF_P: tl.constexpr, TAIL_P: tl.constexpr,
                          D_P: tl.constexpr, INTERLEAVED: tl.constexpr, Q_TAIL: tl.constexpr,
                          K_TAIL: tl.constexpr, POS_FROM_LENS: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    tok = tl.program_id(0)
    g = tl.program_id(1)
    b = (tok // S).to(tl.int64)
    s = (tok % S).to(tl.int64)
    cpos = tl.load(len_ptr + b * slen).to(tl.int64) + s
    ok = (cpos >= 0) & (cpos < S_max)
    if g < q_groups + k_groups:
        if POS_FROM_LENS:
            pos = cpos
        else:
            pos = tl.load(pos_ptr + (b * spb + s * sps)).to(tl.int64)
        c, sn = _angles(cos_ptr, sin_ptr, pos, P, scos, ssin, HALF, HALF_P)
        if g < q_groups:
            _rotate_heads(q_ptr, qo_ptr, c, sn, b * sqb + s * sqs, b * sqob + s * sqos, b >= 0, g * HBQ, Hq,
                          sqh, sqoh, HALF, D, HBQ, HALF_P, TAIL_P, INTERLEAVED, Q_TAIL)
        else:
            _rotate_heads(k_ptr, kc_ptr, c, sn, b * skb + s * sks, b * skcb + cpos * skcs, ok,
                          (g - q_groups) * HBK, Hkv, skh, skch, HALF, D, HBK, HALF_P, TAIL_P, INTERLEAVED, K_TAIL)
    else:
        heads = ((g - q_groups - k_groups) * HBK + tl.arange(0, HBK)).to(tl.int64)
        d = tl.arange(0, D_P)
        m = tl.where(ok, heads < Hkv, False)[:, None] & (d < D)[None, :]
        x = tl.load(v_ptr + (b * svb + s * svs) + heads[:, None] * svh + d[None, :], mask=m)
        tl.store(vc_ptr + (b * svcb + cpos * svcs) + heads[:, None] * svch + d[None, :], x, mask=m)


_rotary = TritonLauncher(_rotary_kernel)


def _heads_per_group(h: int, width: int) -> int:
    return max(1, min(next_power_of_2(max(h, 1)), TILE // width))


# Launch arguments per call signature (see problem.rotary_signature / append_signature): grid,
# scalar and constexpr arguments, the part of the launch key they decide, num_warps, device index.
_plans: LRU[tuple, tuple] = LRU(4096, "rotary.launch_plans")


def _keep(kind: str, sig: Optional[tuple], plan: tuple) -> tuple:
    """Keep ``plan`` under its signature; with launch plans off (``OPFORGE_PLANS=0``) every call
    computes its launch arguments afresh, as the general path of the other families does."""
    if sig is not None and plans.enabled():
        _plans.put((kind, sig), plan)
    return plan


def _launch(launcher: TritonLauncher, plan: tuple, tensors: tuple) -> None:
    """Launch with the plan's arguments; the launch key is completed by the pointers' alignment."""
    grid, scalars, key0, warps, index = plan
    ptrs = [t.data_ptr() for t in tensors]
    key = key0 + tuple([a & 15 for a in ptrs])
    if not launcher.launch_raw(key, grid, ptrs + scalars, warps, index):
        launcher(grid, tensors + tuple(scalars), num_warps=warps, key=key)


def _rotary_plan(call: RotaryCall, qo, ko) -> tuple:
    p = call.problem
    q, k, cos, sin, pos = call.q, call.k, call.cos, call.sin, call.positions
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    half = p.rotary_dim // 2
    half_p = next_power_of_2(half)
    copy_tail = not call.inplace and p.rotary_dim < d
    tail_p = next_power_of_2(d - p.rotary_dim) if copy_tail else 1
    width = max(half_p, tail_p)
    hbq, hbk = _heads_per_group(hq, width), _heads_per_group(hkv, width)
    q_groups, k_groups = cdiv(hq, hbq), cdiv(hkv, hbk)
    spb, sps = (pos.stride(0), pos.stride(1)) if pos.dim() == 2 else (0, pos.stride(0))
    warps = NUM_WARPS or max(1, min(8, max(hbq, hbk) * width // 512))
    ints = (s, hq, hkv, half, d, cos.shape[0], spb, sps, cos.stride(0), sin.stride(0), *q.stride()[:3],
            *qo.stride()[:3], *k.stride()[:3], *ko.stride()[:3], q_groups)
    consts = (hbq, hbk, half_p, tail_p, p.interleaved, copy_tail, pdl.on(q.device))
    # what Triton specializes on: dtypes and 16-byte alignment of the tensors (added per call),
    # the class of each int, the constexprs
    key0 = (q.get_device(), pos.dtype, q.dtype) + tuple(map(int_spec, ints)) + consts + (warps,)
    return (b * s, q_groups + k_groups), list(ints + consts), key0, warps, q.get_device()


def launch_rotary(call: RotaryCall):
    if call.inplace:
        qo, ko = call.q, call.k
    else:
        qo = alloc.empty_packed_like(call.q)
        ko = alloc.empty_packed_like(call.k)
    sig = call.sig
    plan = _plans.get(("rotary", sig)) if sig is not None and plans.enabled() else None
    if plan is None:   # new outputs' strides follow from q's and k's: the signature decides them too
        plan = _keep("rotary", sig, _rotary_plan(call, qo, ko))
    _launch(_rotary, plan, (call.q, call.k, qo, ko, call.cos, call.sin, call.positions))
    return qo, ko


@triton.jit
def _kv_append_kernel(kc_ptr, vc_ptr, k_ptr, v_ptr, len_ptr, S_new, H, D, S_max, slen,
                      skcb, skch, skcs, svcb, svch, svcs, skb, skh, sks, svb, svh, svs,
                      HB: tl.constexpr, D_P: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    tok = tl.program_id(0)
    g = tl.program_id(1)
    b = tok // S_new
    s = tok % S_new
    pos = tl.load(len_ptr + b.to(tl.int64) * slen).to(tl.int64) + s
    ok = (pos >= 0) & (pos < S_max)
    heads = (g * HB + tl.arange(0, HB)).to(tl.int64)
    d = tl.arange(0, D_P)
    m = tl.where(ok, (heads < H)[:, None] & (d < D)[None, :], False)
    b64 = b.to(tl.int64)
    s64 = s.to(tl.int64)
    kx = tl.load(k_ptr + (b64 * skb + s64 * sks) + heads[:, None] * skh + d[None, :], mask=m)
    vx = tl.load(v_ptr + (b64 * svb + s64 * svs) + heads[:, None] * svh + d[None, :], mask=m)
    tl.store(kc_ptr + (b64 * skcb + pos * skcs) + heads[:, None] * skch + d[None, :], kx, mask=m)
    tl.store(vc_ptr + (b64 * svcb + pos * svcs) + heads[:, None] * svch + d[None, :], vx, mask=m)


_kv_append = TritonLauncher(_kv_append_kernel)


def _kv_append_plan(call: AppendCall) -> tuple:
    kc, vc, k, v, lens = call.k_cache, call.v_cache, call.k, call.v, call.cache_seqlens
    b, h, s_new, d = k.shape
    d_p = next_power_of_2(d)
    hb = _heads_per_group(h, d_p)
    warps = max(1, min(8, hb * d_p // 512))
    ints = (s_new, h, d, kc.shape[2], lens.stride(0), *kc.stride()[:3], *vc.stride()[:3], *k.stride()[:3],
            *v.stride()[:3])
    consts = (hb, d_p, pdl.on(k.device))
    key0 = (k.get_device(), k.dtype, lens.dtype) + tuple(map(int_spec, ints)) + consts + (warps,)
    return (b * s_new, cdiv(h, hb)), list(ints + consts), key0, warps, k.get_device()


def launch_kv_append(call: AppendCall) -> None:
    sig = call.sig
    plan = _plans.get(("append", sig)) if sig is not None and plans.enabled() else None
    if plan is None:
        plan = _keep("append", sig, _kv_append_plan(call))
    _launch(_kv_append, plan, (call.k_cache, call.v_cache, call.k, call.v, call.cache_seqlens))
    return None


_rotary_append = TritonLauncher(_rotary_append_kernel)


def _fused_plan(call: FusedCall, qo) -> tuple:
    p = call.problem
    rot, app = call.rot, call.app
    q, k, v, kc, vc, lens = rot.q, rot.k, app.v, app.k_cache, app.v_cache, app.cache_seqlens
    cos, sin = rot.cos, rot.sin
    pos = rot.positions if rot.positions is not None else lens   # unused when taken from lens
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    half = p.rotary_dim // 2
    half_p = next_power_of_2(half)
    q_tail = not rot.inplace and p.rotary_dim < d
    k_tail = p.rotary_dim < d
    tail_p = next_power_of_2(d - p.rotary_dim) if k_tail else 1
    d_p = next_power_of_2(d)
    width = max(half_p, tail_p)
    hbq, hbk = _heads_per_group(hq, width), _heads_per_group(hkv, d_p)
    q_groups, k_groups = cdiv(hq, hbq), cdiv(hkv, hbk)
    if rot.positions is None:
        spb = sps = 0
    else:
        spb, sps = (pos.stride(0), pos.stride(1)) if pos.dim() == 2 else (0, pos.stride(0))
    warps = max(1, min(8, max(hbq * width, hbk * d_p) // 512))
    ints = (s, hq, hkv, half, d, cos.shape[0], kc.shape[2], spb, sps, lens.stride(0), cos.stride(0), sin.stride(0),
            *q.stride()[:3], *qo.stride()[:3], *k.stride()[:3], *v.stride()[:3], *kc.stride()[:3],
            *vc.stride()[:3], q_groups, k_groups)
    consts = (hbq, hbk, half_p, tail_p, d_p, p.interleaved, q_tail, k_tail, rot.positions is None, pdl.on(q.device))
    key0 = (q.get_device(), q.dtype, pos.dtype, lens.dtype) + tuple(map(int_spec, ints)) + consts + (warps,)
    return (b * s, q_groups + 2 * k_groups), list(ints + consts), key0, warps, q.get_device()


def launch_fused(call: FusedCall):
    rot, app = call.rot, call.app
    q = rot.q
    qo = q if rot.inplace else alloc.empty_packed_like(q)
    sig = call.sig
    plan = _plans.get(("fused", sig)) if sig is not None and plans.enabled() else None
    if plan is None:
        plan = _keep("fused", sig, _fused_plan(call, qo))
    pos = rot.positions if rot.positions is not None else app.cache_seqlens
    _launch(_rotary_append, plan, (q, rot.k, app.v, qo, app.k_cache, app.v_cache, rot.cos, rot.sin, pos,
                                   app.cache_seqlens))
    return qo


def supports(p: RotaryProblem) -> Optional[str]:
    name = "k_cache" if p.op == "kv_cache_append" else "q"
    return kernel_dtype_reason("triton", p.dtype, name) or \
        (None if p.head_dim <= MAX_HEAD_DIM else f"D={p.head_dim} > {MAX_HEAD_DIM}")


def launch(call):
    op = call.problem.op
    if op == "rotary_embedding":
        return launch_rotary(call)
    return launch_kv_append(call) if op == "kv_cache_append" else launch_fused(call)


VARIANTS = (("heads", supports, launch,
             "one program per token and block of heads; q and k (or k and v) in one launch"),)
