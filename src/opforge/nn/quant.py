"""``QuantLinear`` (an ``nn.Linear`` with a quantized weight) and ``quantize_model``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..ops.quant import QuantizedWeight, linear, quantize_weight


class QuantLinear(torch.nn.Module):
    """``y = x @ W.T + b`` with W stored as a ``QuantizedWeight``, running ``opforge.linear``.

    The packed codes, scales and zeros are buffers (``qweight``, ``scales_t``, ``zeros_t``), so
    ``.to(device)`` and ``state_dict`` work as for any module. Scales and zeros are kept as their
    raw bits (an integer view), so ``model.half()`` or ``model.to(torch.bfloat16)`` cannot round
    them and change the quantized weight; the bias, if any, follows such casts and is cast to x's
    dtype in ``forward``. Build one with ``from_linear``.

    Example:
        >>> import torch, opforge
        >>> lin = torch.nn.Linear(256, 64)
        >>> q = opforge.nn.QuantLinear.from_linear(lin, bits=8, group_size=128)
        >>> x = torch.randn(3, 256)
        >>> bool((q(x) - lin(x)).norm() / lin(x).norm() < 0.02)
        True
    """

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None):
        super().__init__()
        if weight.layout != "rows":     # the buffers (and files saved from them) hold the rows layout
            raise ValueError(f"QuantLinear takes rows-layout weights, got layout {weight.layout!r}: "
                             "repack(weight, 'rows') first")
        self.out_features, self.in_features = weight.shape
        self.bits, self.group_size = weight.bits, weight.group_size
        self.scale_dtype = weight.scales_t.dtype
        self.register_buffer("qweight", weight.packed)
        self.register_buffer("scales_t", _as_bits(weight.scales_t))
        self.register_buffer("zeros_t", None if weight.zeros_t is None else _as_bits(weight.zeros_t))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear_module: torch.nn.Linear, bits: int = 4, group_size: int = 128,
                    symmetric: bool = False) -> "QuantLinear":
        """Quantize ``linear_module.weight`` (see ``opforge.quantize_weight``), keep its bias."""
        if not isinstance(linear_module, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(linear_module).__name__}")
        qw = quantize_weight(linear_module.weight.detach(), bits, group_size, symmetric)
        return cls(qw, linear_module.bias)

    @property
    def weight(self) -> QuantizedWeight:
        """The QuantizedWeight over this module's current buffers (no copy)."""
        zeros = None if self.zeros_t is None else self.zeros_t.view(self.scale_dtype)
        return QuantizedWeight(self.qweight, self.scales_t.view(self.scale_dtype), zeros, self.bits,
                               self.group_size, (self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return linear(x, self.weight, bias)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The scale buffers hold raw bits: a copy from bits of another width would convert the integers
        # and silently give another weight, so refuse it (torch's load_state_dict raises with this message).
        for name in ("scales_t", "zeros_t"):
            mine, theirs = getattr(self, name), state_dict.get(prefix + name)
            if mine is not None and isinstance(theirs, torch.Tensor) and theirs.dtype != mine.dtype:
                error_msgs.append(
                    f"{prefix}{name}: this QuantLinear keeps {self.scale_dtype} scales as {mine.dtype} bits, the state "
                    f"dict holds {theirs.dtype}; a copy would change the weight. Build the module from a "
                    f"QuantizedWeight of the saved scale dtype instead (QuantLinear(QuantizedWeight(...)))")
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, bias={self.bias is not None}")


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits as an integer tensor of the same size (no copy)."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@dataclass(frozen=True)
class Replaced:
    """One ``nn.Linear`` that ``quantize_model`` replaced, and its weight bytes before and after."""

    name: str
    out_features: int
    in_features: int
    bytes_before: int
    bytes_after: int


def _skipped(name: str, skip: Sequence[str]) -> bool:
    return name in skip or name.rsplit(".", 1)[-1] in skip


def quantize_model(model: torch.nn.Module, bits: int = 4, group_size: int = 128,
                   skip: Sequence[str] = ("lm_head",), symmetric: bool = False) -> list[Replaced]:
    """Replace every ``nn.Linear`` of ``model`` in place by a ``QuantLinear``.

    Modules whose full name or last name component is in ``skip`` stay dense. Every weight is
    checked first (K divisible by the group, finite values): if one fails, ``ValueError`` names
    it and no module has been replaced.

    Returns:
        One ``Replaced`` per module (name, shape, weight + bias bytes before and after).

    Example:
        >>> import torch, opforge
        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
        >>> done = opforge.quantize_model(model, bits=4, group_size=128)
        >>> [(r.name, r.bytes_before, r.bytes_after) for r in done]
        [('0', 131584, 17920), ('2', 33024, 4608)]
        >>> model(torch.randn(2, 256)).shape
        torch.Size([2, 64])
    """
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and not _skipped(name, skip)]
    quantized = []
    for name, m in targets:   # quantize all first: nothing is replaced if any weight is refused
        try:
            quantized.append(QuantLinear.from_linear(m, bits, group_size, symmetric))
        except (ValueError, TypeError) as e:
            raise type(e)(f"cannot quantize {name or 'the model'} ({type(m).__name__} "
                          f"{m.out_features}x{m.in_features}): {e}") from e
    done = []
    for (name, m), q in zip(targets, quantized):
        before = sum(t.numel() * t.element_size() for t in (m.weight, m.bias) if t is not None)
        after = q.weight.nbytes + (0 if q.bias is None else q.bias.numel() * q.bias.element_size())
        if name:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, q)
        done.append(Replaced(name, m.out_features, m.in_features, before, after))
    return done
