"""Pre-quantized checkpoints (GPTQ, AWQ) turned into integer codes, scales and zeros.

Both formats store a linear layer ``<prefix>`` as ``qweight``/``qzeros`` (int32 words, each
holding ``32 // bits`` codes, the first in the lowest bits) and ``scales`` of shape
``(K / group, N)``; the weight they represent is ``w[n, k] = (code[k, n] - zero[g, n]) *
scale[g, n]`` with ``g = k // group``. They differ in how the words are filled:

- GPTQ: ``qweight`` is ``(K * bits / 32, N)``, packed along K (code of row ``k`` in word
  ``k // per`` at bits ``bits * (k % per)``); ``qzeros`` is ``(K / group, N * bits / 32)``,
  packed along N the same way. An optional ``g_idx`` ``(K,)`` gives each row's group. The
  classic ("v1") convention, written by AutoGPTQ and read by transformers, stores ``zero - 1``
  in ``qzeros``; GPTQModel's ``checkpoint_format: "gptq_v2"`` stores the zero itself.
- AWQ (GEMM layout, 4-bit): ``qweight`` is ``(K, N / 8)``, packed along N, and word slot ``i``
  holds column ``8 * word + AWQ_ORDER[i]``; ``qzeros`` ``(K / group, N / 8)`` likewise. Zeros
  are stored as they are.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from .errors import SafetensorsError

PARTS = ("qweight", "qzeros", "scales", "g_idx")
REQUIRED = ("qweight", "qzeros", "scales")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # word slot i holds column AWQ_ORDER[i] of its group of 8


@dataclass
class QuantConfig:
    """What a checkpoint's config says about its quantization (all optional)."""

    method: Optional[str] = None      # "gptq" or "awq"
    bits: Optional[int] = None
    group_size: Optional[int] = None
    checkpoint_format: Optional[str] = None  # GPTQ: "gptq" (v1, zero - 1 stored) or "gptq_v2"
    version: Optional[str] = None     # AWQ: "gemm" (supported) or "gemv"...

    @classmethod
    def find(cls, folder: Path) -> "QuantConfig":
        """Read ``config.json``'s ``quantization_config`` or ``quantize_config.json`` in ``folder``."""
        for name, key in (("config.json", "quantization_config"), ("quantize_config.json", None),
                          ("quant_config.json", None)):
            p = folder / name
            if not p.is_file():
                continue
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            d = d.get(key) if key else d
            if isinstance(d, dict):
                method = d.get("quant_method") or d.get("quant_type")
                return cls(method=str(method).lower() if method else None,
                           bits=d.get("bits", d.get("w_bit")),
                           group_size=d.get("group_size", d.get("q_group_size")),
                           checkpoint_format=d.get("checkpoint_format"),
                           version=str(d["version"]).lower() if d.get("version") else None)
        return cls()


def split_part(name: str) -> Optional[Tuple[str, str]]:
    """The layer prefix and part of a GPTQ/AWQ tensor name; None for other names.

    Example:
        >>> from opforge.io.prequant import split_part
        >>> split_part("layers.0.q_proj.qweight"), split_part("layers.0.q_proj.weight")
        (('layers.0.q_proj', 'qweight'), None)
    """
    prefix, _, last = name.rpartition(".")
    return (prefix, last) if prefix and last in PARTS else None


def unpack(words: torch.Tensor, bits: int, dim: int, order: Optional[Tuple[int, ...]] = None) -> torch.Tensor:
    """Unpack int32 words into int32 codes along ``dim`` (0 or 1): that dimension grows by
    ``32 // bits``. ``order[i]`` is the position, within its word's run, of the code in slot
    ``i`` (slot ``i`` = bits ``bits*i .. bits*i + bits-1``); None means slot ``i`` is position ``i``.

    Example:
        >>> import torch
        >>> from opforge.io.prequant import unpack
        >>> unpack(torch.tensor([[0x76543210]], dtype=torch.int32), 4, 1).tolist()
        [[0, 1, 2, 3, 4, 5, 6, 7]]
        >>> unpack(torch.tensor([[0x76543210]], dtype=torch.int32), 4, 1, (0, 2, 4, 6, 1, 3, 5, 7)).tolist()
        [[0, 4, 1, 5, 2, 6, 3, 7]]
    """
    per = 32 // bits
    shifts = torch.arange(per, device=words.device, dtype=torch.int32) * bits
    slots = (words.unsqueeze(-1) >> shifts) & (2 ** bits - 1)  # (..., per): slot i of each word
    if order is not None:
        where = [0] * per
        for slot, pos in enumerate(order):
            where[pos] = slot
        slots = slots[..., torch.tensor(where, device=words.device)]
    if dim == 1:
        return slots.reshape(words.shape[0], words.shape[1] * per)
    return slots.permute(0, 2, 1).reshape(words.shape[0] * per, words.shape[1])


def _fail(msg: str, file: str, prefix: str) -> SafetensorsError:
    return SafetensorsError(msg, file, prefix + ".qweight")


def decode(prefix: str, parts: Dict[str, torch.Tensor], config: QuantConfig, gptq_format: Optional[str],
           file: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """The codes (N, K), scales (N, G), zeros (N, G, in code units), bits and group size that a
    GPTQ or AWQ layer represents, exactly.

    ``gptq_format``: ``"v1"`` (stored zero + 1), ``"v2"`` (stored zero) or None (the config's
    ``checkpoint_format`` if it says ``gptq_v2``, else v1, as AutoGPTQ and transformers).
    """
    missing = [p for p in REQUIRED if p not in parts]
    if missing:
        raise _fail(f"pre-quantized layer {prefix!r} lacks {', '.join(prefix + '.' + m for m in missing)}", file, prefix)
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    for name, t in (("qweight", qweight), ("qzeros", qzeros)):
        if t.dtype != torch.int32 or t.dim() != 2:
            raise _fail(f"{prefix}.{name} must be a 2-D int32 tensor, got {t.dtype} {tuple(t.shape)}", file, prefix)
    if not scales.dtype.is_floating_point or scales.dim() != 2:
        raise _fail(f"{prefix}.scales must be a 2-D float tensor, got {scales.dtype} {tuple(scales.shape)}",
                    file, prefix)
    groups, n = scales.shape
    if n == 0 or groups == 0:
        raise _fail(f"{prefix}.scales has an empty shape {tuple(scales.shape)}", file, prefix)
    method = config.method if config.method in ("gptq", "awq") else None
    if method is None:  # the layout tells: GPTQ packs qweight along K, keeping N columns
        method = "gptq" if qweight.shape[1] == n or "g_idx" in parts else "awq"
    if method == "gptq":
        return _gptq(prefix, qweight, qzeros, scales, parts.get("g_idx"), config, gptq_format, file)
    return _awq(prefix, qweight, qzeros, scales, config, file)


def _gptq(prefix, qweight, qzeros, scales, g_idx, config, gptq_format, file):
    groups, n = scales.shape
    if qzeros.shape[1] == 0 or (32 * qzeros.shape[1]) % n:
        raise _fail(f"GPTQ {prefix}.qzeros {tuple(qzeros.shape)} does not pack N={n} zeros", file, prefix)
    bits = config.bits or (32 * qzeros.shape[1]) // n
    if bits not in (4, 8):
        raise _fail(f"GPTQ with {bits} bits: opforge represents 4- and 8-bit weights only", file, prefix)
    per = 32 // bits
    k = qweight.shape[0] * per
    if qweight.shape[1] != n or qzeros.shape != (groups, n // per) or k % groups:
        raise _fail(f"GPTQ shapes disagree: qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, "
                    f"scales {tuple(scales.shape)} for {bits}-bit", file, prefix)
    group = k // groups
    if g_idx is not None:
        expect = torch.arange(k, device=g_idx.device) // group
        if tuple(g_idx.shape) != (k,) or not torch.equal(g_idx.to(torch.int64), expect):
            raise SafetensorsError(
                f"act-order GPTQ (desc_act=True): {prefix}.g_idx assigns rows to groups out of order; "
                "opforge's QuantizedWeight needs contiguous groups along K. Re-quantize with "
                "desc_act=False (or static_groups=True), or load the float weights with quantize='int4'.",
                file, prefix + ".g_idx")
    fmt = gptq_format or ("v2" if config.checkpoint_format == "gptq_v2" else "v1")
    if fmt not in ("v1", "v2"):
        raise ValueError(f"gptq_format must be 'v1', 'v2' or None, got {gptq_format!r}")
    codes = unpack(qweight, bits, 0)                  # (K, N)
    zeros = unpack(qzeros, bits, 1).to(torch.float32)  # (G, N)
    if fmt == "v1":
        zeros += 1
    return codes.t(), scales.t(), zeros.to(scales.dtype).t(), bits, group  # zeros <= 256: exact in any float


def _awq(prefix, qweight, qzeros, scales, config, file):
    groups, n = scales.shape
    bits = config.bits or 4
    if bits != 4:
        raise _fail(f"AWQ with {bits} bits: only 4-bit AWQ (GEMM layout) is supported", file, prefix)
    if config.version not in (None, "gemm"):
        raise _fail(f"AWQ version {config.version!r}: only the GEMM layout is supported", file, prefix)
    k = qweight.shape[0]
    if qweight.shape[1] * 8 != n or qzeros.shape != (groups, n // 8) or k % groups:
        raise _fail(f"neither GPTQ nor AWQ shapes: qweight {tuple(qweight.shape)}, qzeros "
                    f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}", file, prefix)
    codes = unpack(qweight, 4, 1, AWQ_ORDER)
    zeros = unpack(qzeros, 4, 1, AWQ_ORDER).to(torch.float32)
    return codes.t(), scales.t(), zeros.to(scales.dtype).t(), 4, k // groups
