"""``opforge.patch(model)``: opforge's ops inside a Hugging Face transformers model, per instance.

Nothing global is changed in transformers: module forwards are replaced on the instances of this
model only, attention is registered under a new name ("opforge") in transformers'
``AttentionInterface`` and selected through a copy of this model's config, so another model
sharing the original config object keeps its own attention.
"""
from __future__ import annotations

import copy
import types
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .. import api as opforge

_GATED_FAMILIES = ("Llama", "Mistral", "Qwen2", "Qwen3")
_TANH_GELU = ("NewGELUActivation", "GELUTanh", "GELUPytorchTanh", "PytorchGELUTanh", "FastGELUActivation")


@dataclass
class PatchReport:
    """What ``opforge.patch`` replaced (``replaced[kind] = count``) and what it left (with why)."""

    replaced: dict[str, int] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)

    def _add(self, kind: str) -> None:
        self.replaced[kind] = self.replaced.get(kind, 0) + 1

    def __str__(self) -> str:
        lines = [f"replaced {n} x {k}" for k, n in sorted(self.replaced.items())]
        lines += [f"left {k}: {why}" for k, why in sorted(self.left.items())]
        return "\n".join(lines) or "nothing replaced"


def _rms_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(self, "variance_epsilon", None) or getattr(self, "eps", 1e-6)
    return opforge.rms_norm(x, self.weight, eps)


def _layer_norm_forward(self: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return opforge.layer_norm(x, self.weight, self.bias, self.eps)


def _gated_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(opforge.swiglu(self.gate_proj(x), self.up_proj(x)))


def _gelu_forward(approximate: str):
    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return opforge.gelu(x, approximate=approximate)
    return forward


class _RotaryTables:
    """opforge's rotary tables from transformers' (cos, sin), built once per model forward.

    transformers computes (cos, sin) of shape (B, S, D) (the two halves equal) once per forward
    and hands the same tensors to every layer; the tables (one row per token) and the row index
    are kept for the last pair seen, held by reference so identity is a safe key.
    """

    def __init__(self) -> None:
        self._key: Optional[tuple] = None
        self._value: Optional[tuple] = None

    def get(self, cos: torch.Tensor, sin: torch.Tensor, b: int, s: int, device: torch.device) -> tuple:
        key = self._key
        if key is None or key[0] is not cos or key[1] is not sin or key[2:] != (b, s, device):
            half = cos.shape[-1] // 2
            table_cos = cos[..., :half].expand(b, s, half).reshape(b * s, half).float()
            table_sin = sin[..., :half].expand(b, s, half).reshape(b * s, half).float()
            rows = torch.arange(b * s, device=device).view(b, s)
            self._key, self._value = (cos, sin, b, s, device), (table_cos, table_sin, rows)
        return self._value


def _rotary_attention_forward(tables: _RotaryTables):
    """An attention module's forward with rotary through opforge (tables shared by the model's layers)."""
    def forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Optional[tuple] = None,
                attention_mask: Optional[torch.Tensor] = None, past_key_values: Any = None, **kwargs: Any):
        cache = _take_cache(past_key_values, kwargs)
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            q = self.q_norm(q)
        k = self.k_proj(hidden_states).view(b, s, -1, self.head_dim)
        if hasattr(self, "k_norm"):
            k = self.k_norm(k)
        v = self.v_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        table_cos, table_sin, rows = tables.get(*position_embeddings, b, s, q.device)
        q, k = opforge.rotary_embedding(q.transpose(1, 2), k.transpose(1, 2), table_cos, table_sin, rows)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        fn = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation] \
            if self.config._attn_implementation in ALL_ATTENTION_FUNCTIONS else _eager_fallback
        out, weights = fn(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(b, s, -1).contiguous()), weights
    return forward


#: The names transformers has given the KV cache argument of an attention forward: ``cache``
#: (5.x), ``past_key_values`` (4.56 - 4.57), ``past_key_value`` (4.53 - 4.55).
_CACHE_ARGUMENTS = ("cache", "past_key_value")


def _take_cache(past_key_values: Any, kwargs: dict) -> Any:
    """The KV cache transformers passed under whichever name its version uses, removed from
    ``kwargs`` (the attention function must not receive it twice)."""
    found = [past_key_values] + [kwargs.pop(name, None) for name in _CACHE_ARGUMENTS]
    return next((c for c in found if c is not None), None)


def _eager_fallback(module, q, k, v, mask, dropout=0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)


def _opforge_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature over ``opforge.attention``.

    A mask transformers could not drop (padding) goes to transformers' SDPA function instead.
    """
    if attention_mask is not None or dropout:
        return _eager_fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = opforge.attention(query, key, value, causal=query.shape[2] > 1, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> bool:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register("opforge", _opforge_attention)
    AttentionMaskInterface.register("opforge", sdpa_mask)      # same mask rules as sdpa: None when only causal
    return True


def _own_config(model: torch.nn.Module) -> Any:
    """Give this model (and its modules) a private copy of its config; returns the copy."""
    old = model.config
    new = copy.copy(old)
    for module in model.modules():
        if getattr(module, "config", None) is old:
            module.config = new
    return new


def patch(model: torch.nn.Module) -> PatchReport:
    """Replace, on this model instance only, norms, activations, rotary and attention with opforge's.

    Llama/Mistral/Qwen2/Qwen3: RMSNorm modules, the gated MLP (swiglu), rotary embedding and
    attention (``opforge.attention`` registered in transformers' ``AttentionInterface`` as
    "opforge"; padded batches keep SDPA). GPT-2/BERT-style: ``nn.LayerNorm`` and GELU modules.
    Anything else is left as it was and listed in ``report.left``.

    Example:
        >>> import torch, opforge
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> opforge.patch(net).replaced
        {'LayerNorm': 1}
    """
    report = PatchReport()
    family = next((f for f in _GATED_FAMILIES if type(model).__name__.startswith(f)), None)
    tables = _RotaryTables()
    for name, module in model.named_modules():
        cls = type(module).__name__
        if isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine:
            module.forward = types.MethodType(_layer_norm_forward, module)
            report._add("LayerNorm")
        elif cls.endswith("RMSNorm") and hasattr(module, "weight"):
            module.forward = types.MethodType(_rms_forward, module)
            report._add(cls)
        elif family and all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj")):
            act = type(getattr(module, "act_fn", None)).__name__
            if act in ("SiLUActivation", "SiLU"):
                module.forward = types.MethodType(_gated_mlp_forward, module)
                report._add(f"{cls} (swiglu)")
            else:
                report.left[name] = f"gated MLP with activation {act}"
        elif cls in _TANH_GELU or cls == "GELUActivation" or isinstance(module, torch.nn.GELU):
            approximate = getattr(module, "approximate", "none") if isinstance(module, torch.nn.GELU) \
                else ("none" if cls == "GELUActivation" else "tanh")
            if cls == "FastGELUActivation":      # a different tanh constant form; equal to tanh GELU in value
                approximate = "tanh"
            module.forward = types.MethodType(_gelu_forward(approximate), module)
            report._add(f"{cls} (gelu {approximate})")
        elif family and cls.endswith("Attention") and all(hasattr(module, p) for p in ("q_proj", "k_proj", "o_proj")):
            module.forward = types.MethodType(_rotary_attention_forward(tables), module)
            report._add(f"{cls} (rotary)")
    if any(k.endswith("(rotary)") for k in report.replaced):
        if _register_attention() and getattr(model, "config", None) is not None:
            _own_config(model)._attn_implementation_internal = "opforge"
            report._add("attention implementation -> opforge")
        else:
            report.left["attention"] = "transformers' AttentionInterface is not available"
    elif family is None:
        report.left["attention/rotary"] = f"{type(model).__name__}: only the Llama/Mistral/Qwen2/Qwen3 families"
    return report
