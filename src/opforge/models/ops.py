"""Every op the models call, in one place.

Each function calls ``opforge.<name>`` when this build of opforge has it, else a small torch
composite next to a ``# bridge:`` comment. The bridges exist only until the op families of the
other branches (attention, rotary/cache, quantized linear, SafeTensors loading) are merged; a
bridge that runs is recorded in ``opforge.trace()`` as backend ``torch``, variant ``bridge``,
so a trace always shows which path a model step took.

Example:
    >>> import torch, opforge
    >>> from opforge.models import ops
    >>> with opforge.trace() as t:
    ...     y = ops.linear(torch.randn(2, 8), torch.randn(4, 8))
    >>> y.shape, t[0].op
    (torch.Size([2, 4]), 'linear')
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import trace as _trace

rms_norm = opforge.rms_norm
add_rms_norm = opforge.add_rms_norm
swiglu = opforge.swiglu


def _native(name: str) -> Optional[Callable[..., Any]]:
    return getattr(opforge, name, None)


def _bridged(name: str, x: torch.Tensor, fn: Callable[..., Any], *args: Any) -> Any:
    if _trace._active:
        return _trace.run_traced(name, "torch", "bridge", x, "models/ops.py composite", fn, *args)
    return fn(*args)


def have(name: str) -> bool:
    """Whether ``opforge.<name>`` exists in this build (else the bridge runs).

    Example:
        >>> from opforge.models import ops
        >>> ops.have("rms_norm")
        True
    """
    return _native(name) is not None


# bridge: causal attention aligned to the end, GQA by repeating k/v heads.
def _attention_bridge(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      scale: Optional[float]) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        keep = torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None) -> torch.Tensor:
    """``opforge.attention`` (q (B,Hq,Sq,D), k/v (B,Hkv,Sk,D)), else the bridge.

    Example:
        >>> import torch
        >>> from opforge.models import ops
        >>> ops.attention(torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), causal=True).shape
        torch.Size([1, 4, 3, 8])
    """
    fn = _native("attention")
    if fn is not None:
        return fn(q, k, v, causal=causal, scale=scale)
    return _bridged("attention", q, _attention_bridge, q, k, v, causal, scale)


# bridge: attention of the last Sq positions over each sequence's valid cache prefix.
def _decode_attention_bridge(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, seqlens: torch.Tensor,
                             scale: Optional[float]) -> torch.Tensor:
    groups, sq, smax = q.shape[1] // kc.shape[1], q.shape[2], kc.shape[2]
    k, v = kc.repeat_interleave(groups, 1).float(), vc.repeat_interleave(groups, 1).float()
    scores = (q.float() @ k.transpose(-1, -2)) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    last = seqlens.long()[:, None, None] - sq + torch.arange(sq, device=q.device)[None, :, None]
    keep = torch.arange(smax, device=q.device)[None, None, :] <= last           # (B, Sq, Smax)
    scores = scores.masked_fill(~keep[:, None], float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, *,
                     scale: Optional[float] = None) -> torch.Tensor:
    """``opforge.decode_attention`` (cache_seqlens counts the new tokens), else the bridge.

    Example:
        >>> import torch
        >>> from opforge.models import ops
        >>> kc = torch.randn(1, 1, 6, 8)
        >>> out = ops.decode_attention(torch.randn(1, 2, 1, 8), kc, kc, torch.tensor([3], dtype=torch.int32))
        >>> out.shape
        torch.Size([1, 2, 1, 8])
    """
    fn = _native("decode_attention")
    if fn is not None:
        return fn(q, k_cache, v_cache, cache_seqlens, scale=scale)
    return _bridged("decode_attention", q, _decode_attention_bridge, q, k_cache, v_cache, cache_seqlens, scale)


# bridge: rotate-half rotary embedding from float32 (max_pos, D/2) tables.
def _rotary_bridge(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c, s = cos[positions.long()], sin[positions.long()]                         # (B|1, S, R/2)
    c, s = (c[:, None], s[:, None]) if c.dim() == 3 else (c, s)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
    return rotate(q), rotate(k)


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``opforge.rotary_embedding`` (rotate-half; q (B,H,S,D), positions (B,S)), else the bridge.

    Example:
        >>> import torch
        >>> from opforge.models import ops
        >>> q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
        >>> cos, sin = torch.ones(16, 4), torch.zeros(16, 4)
        >>> torch.equal(ops.rotary_embedding(q, k, cos, sin, torch.arange(3)[None])[0], q)
        True
    """
    fn = _native("rotary_embedding")
    if fn is not None:
        return fn(q, k, cos, sin, positions)
    return _bridged("rotary_embedding", q, _rotary_bridge, q, k, cos, sin, positions)


# bridge: scatter the new k/v rows at cache_seqlens[b] + s (index_put is graph-capturable).
def _append_bridge(kc: torch.Tensor, vc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens: torch.Tensor) -> None:
    b, _, s, _ = k.shape
    rows = seqlens.long()[:, None] + torch.arange(s, device=k.device)[None, :]   # (B, S)
    batch = torch.arange(b, device=k.device)[:, None].expand(b, s)
    kc.transpose(1, 2)[batch, rows] = k.transpose(1, 2)
    vc.transpose(1, 2)[batch, rows] = v.transpose(1, 2)


_append_takes_check: Optional[bool] = None


def kv_cache_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cache_seqlens: torch.Tensor) -> None:
    """``opforge.kv_cache_append`` (unchecked on a GPU: no host sync), else the bridge.

    Example:
        >>> import torch
        >>> from opforge.models import ops
        >>> kc, vc = torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2)
        >>> ops.kv_cache_append(kc, vc, torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2), torch.tensor([2]))
        >>> kc[0, 0, :, 0].tolist()
        [0.0, 0.0, 1.0, 0.0]
    """
    global _append_takes_check
    fn = _native("kv_cache_append")
    if fn is None:
        return _bridged("kv_cache_append", k, _append_bridge, k_cache, v_cache, k, v, cache_seqlens)
    if _append_takes_check is None:
        _append_takes_check = "check" in inspect.signature(fn).parameters
    if _append_takes_check and k.device.type != "cpu":
        return fn(k_cache, v_cache, k, v, cache_seqlens, check=False)
    return fn(k_cache, v_cache, k, v, cache_seqlens)


def linear(x: torch.Tensor, w: Any, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``opforge.linear`` (dense or ``opforge.QuantizedWeight``), else torch's F.linear (dense only).

    Example:
        >>> import torch
        >>> from opforge.models import ops
        >>> ops.linear(torch.ones(1, 3), torch.ones(2, 3)).tolist()
        [[3.0, 3.0]]
    """
    fn = _native("linear")
    if fn is not None:
        return fn(x, w, bias)
    # bridge: dense cuBLAS matmul until opforge.linear is merged.
    return _bridged("linear", x, F.linear, x, w, bias)


def quantize_weight(w: torch.Tensor, bits: int, group_size: int) -> Any:
    """``opforge.quantize_weight``; raises if this build has no quantized linear yet.

    Example:
        >>> import torch
        >>> from opforge.models import ops
        >>> ops.have("quantize_weight") or True
        True
    """
    fn = _native("quantize_weight")
    if fn is None:
        raise NotImplementedError("quantize= needs opforge.quantize_weight (the quantized-linear family), "
                                  "which this build of opforge does not have")
    return fn(w, bits, group_size)


def load_tensors(path: str, device: torch.device, dtype: Optional[torch.dtype]) -> dict[str, torch.Tensor]:
    """All tensors of one ``.safetensors`` file, on ``device``, floating ones cast to ``dtype``.

    Through ``opforge.load_safetensors`` when present, else (bridge) ``safe_open``, one tensor
    at a time.

    Example:
        >>> import os, tempfile, torch
        >>> from safetensors.torch import save_file
        >>> from opforge.models import ops
        >>> p = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save_file({"a": torch.ones(2)}, p)
        >>> ops.load_tensors(p, torch.device("cpu"), torch.float64)["a"].dtype
        torch.float64
    """
    fn = _native("load_safetensors")
    if fn is not None:
        return fn(path, device=device, dtype=dtype)
    # bridge: read tensor by tensor with safetensors until opforge.load_safetensors is merged.
    from safetensors.torch import safe_open
    out: dict[str, torch.Tensor] = {}
    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            out[name] = t.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else t.dtype)
    return out
