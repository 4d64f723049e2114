"""Reading a Hugging Face ``config.json`` into the few numbers the decoder needs, refusing what it can't do.

Example:
    >>> from opforge.models.config import parse_config
    >>> c = parse_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    ...                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    ...                   "vocab_size": 100})
    >>> c.head_dim, c.rope_theta
    (16, 10000.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The checkpoint asks for something this decoder does not implement (named in the message)."""


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape and math, from ``config.json``."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict]
    tie_word_embeddings: bool
    qk_norm: bool                       # qwen3: RMSNorm over head_dim on q and k before rotary
    max_position_embeddings: int
    sliding_window: Optional[int]
    eos_token_ids: tuple[int, ...]


# config fields whose non-default values change the math and that this decoder does not implement
_MUST_BE = {
    "hidden_act": ("silu",),
    "mlp_bias": (False, None),
    "pretraining_tp": (1, None),        # HF's own forward ignores it at inference; >1 only splits matmuls
    "partial_rotary_factor": (1.0, 1, None),
    "use_sliding_window": (False, None),
    "attn_logit_softcapping": (None,),
    "final_logit_softcapping": (None,),
    "logit_scale": (None, 1, 1.0),
    "query_pre_attn_scalar": (None,),
    "embedding_multiplier": (None, 1, 1.0),
    "residual_multiplier": (None, 1, 1.0),
    "attention_multiplier": (None,),
    "quantization_config": (None,),
}


def _rope(raw: dict) -> tuple[float, Optional[dict]]:
    params = raw.get("rope_parameters")          # transformers >= 5 folds theta and scaling in here
    theta = raw.get("rope_theta")
    scaling = raw.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        scaling = params if params.get("rope_type", params.get("type", "default")) != "default" else None
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("llama3", "linear", "default"):
            raise UnsupportedModelError(f"rope scaling {kind!r} is not supported (llama3, linear or none)")
        if kind == "default":
            scaling = None
    return float(theta if theta is not None else 10000.0), scaling


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Validate a config dict; raise ``UnsupportedModelError`` naming what is not supported.

    Example:
        >>> from opforge.models.config import parse_config
        >>> parse_config({"model_type": "gpt2"})
        Traceback (most recent call last):
        ...
        opforge.models.config.UnsupportedModelError: model_type 'gpt2' is not supported (llama, mistral, qwen2, qwen3)
    """
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(f"model_type {model_type!r} is not supported ({', '.join(SUPPORTED)})")
    archs = raw.get("architectures") or []
    for arch in archs:
        if not arch.endswith("ForCausalLM"):
            raise UnsupportedModelError(f"architecture {arch!r} is not supported (a *ForCausalLM decoder)")
    bad = [f"{k}={raw[k]!r}" for k, allowed in _MUST_BE.items() if k in raw and raw[k] not in allowed]
    if bad:
        raise UnsupportedModelError(f"config fields that change the math are not supported: {', '.join(bad)}")
    if model_type == "qwen3" and raw.get("layer_types") and any(t != "full_attention" for t in raw["layer_types"]):
        raise UnsupportedModelError(f"layer_types {sorted(set(raw['layer_types']))} (only full_attention is supported)")
    theta, scaling = _rope(raw)
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    window = raw.get("sliding_window") if model_type == "mistral" else None
    return ModelConfig(
        model_type=model_type, hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"], num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads, head_dim=head_dim, vocab_size=raw["vocab_size"],
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), qk_norm=model_type == "qwen3",
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)), sliding_window=window,
        eos_token_ids=eos_ids)


def rope_tables(config: ModelConfig, max_positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``cos, sin`` tables (max_positions, head_dim/2) with the config's rope scaling.

    Example:
        >>> from opforge.models.config import parse_config, rope_tables
        >>> c = parse_config({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
        ...     "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 4})
        >>> cos, sin = rope_tables(c, 16, torch.device("cpu"))
        >>> cos.shape, float(cos[0, 0])
        (torch.Size([16, 4]), 1.0)
    """
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    scaling = config.rope_scaling
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = float(scaling["factor"])
        if kind == "linear":
            inv_freq = inv_freq / factor
        else:   # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between
            low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            original = float(scaling["original_max_position_embeddings"])
            wavelength = 2 * math.pi / inv_freq
            blend = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
            inv_freq = (1 - blend) * inv_freq / factor + blend * inv_freq
    inv_freq = inv_freq.float().double()        # HF keeps inv_freq in float32; match its rounding
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)
