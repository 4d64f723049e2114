"""Tiny random checkpoints in the Hugging Face layout, for tests, doctests and smoke runs.

``python -m opforge.models.testing DIR`` writes the tiny Llama checkpoint into DIR, for a first
``opforge generate DIR --prompt-ids 1,2,3``.
"""
from __future__ import annotations

import json
import os
import tempfile
import sys
from typing import Any, Callable, Optional, Sequence

import torch

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
}


def _llama_weights(config: dict[str, Any], r: Callable[..., torch.Tensor], embed_std: float, std: float,
                   qwen_extras: bool) -> dict[str, torch.Tensor]:
    """Hugging Face names to ``r(*shape, std=...)`` draws (in a fixed order) for a llama-family config;
    ``qwen_extras``: qwen2's q/k/v biases and qwen3's q/k norms where the config's model_type has them."""
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    d = config.get("head_dim") or h // heads

    def norm(n: int) -> torch.Tensor:
        return 1.0 + r(n, std=0.1)
    w = {"model.embed_tokens.weight": r(v, h, std=embed_std), "model.norm.weight": norm(h)}
    if not config.get("tie_word_embeddings", False):
        w["lm_head.weight"] = r(v, h, std=std)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(h), norm(h)
        for n, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
            w[p + f"self_attn.{n}_proj.weight"] = r(rows, h, std=std)
            if qwen_extras and config["model_type"] == "qwen2":
                w[p + f"self_attn.{n}_proj.bias"] = r(rows, std=0.1)
        w[p + "self_attn.o_proj.weight"] = r(h, heads * d, std=std)
        if qwen_extras and config["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = norm(d), norm(d)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = r(f, h, std=std), r(f, h, std=std)
        w[p + "mlp.down_proj.weight"] = r(h, f, std=std)
    return w


def random_weights(config: dict[str, Any], seed: int = 0, std: float = 0.2) -> dict[str, torch.Tensor]:
    """float32 random weights under Hugging Face's names for a llama/mistral/qwen2/qwen3 config.

    Example:
        >>> from opforge.models.testing import TINY_LLAMA, random_weights
        >>> random_weights(TINY_LLAMA)["model.embed_tokens.weight"].shape
        torch.Size([64, 32])
    """
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std
    return _llama_weights(config, r, embed_std=1.0, std=std, qwen_extras=True)


def write_checkpoint(directory: str, config: dict[str, Any], weights: dict[str, torch.Tensor],
                     dtype: Optional[torch.dtype] = None) -> str:
    """Write ``config.json`` and ``model.safetensors`` into ``directory``; returns it.

    Example:
        >>> import os, tempfile
        >>> from opforge.models.testing import TINY_LLAMA, random_weights, write_checkpoint
        >>> d = write_checkpoint(tempfile.mkdtemp(), TINY_LLAMA, random_weights(TINY_LLAMA))
        >>> sorted(os.listdir(d))
        ['config.json', 'model.safetensors']
    """
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file({k: (t.to(dtype) if dtype else t).contiguous() for k, t in weights.items()},
              os.path.join(directory, "model.safetensors"))
    return directory


def write_tiny_checkpoint(config: Optional[dict[str, Any]] = None, seed: int = 0) -> str:
    """A tiny random Llama checkpoint in a new temporary directory.

    Example:
        >>> import os
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> os.path.exists(os.path.join(write_tiny_checkpoint(), "config.json"))
        True
    """
    config = dict(config or TINY_LLAMA)
    return write_checkpoint(tempfile.mkdtemp(prefix="opforge-tiny-"), config, random_weights(config, seed))


def tiny_decoder(config: Optional[dict[str, Any]] = None, seed: int = 0, **load_kwargs: Any):
    """A loaded tiny random model on CPU in float32 (max_batch 4, max_seq_len 128 unless given).

    Example:
        >>> from opforge.models.testing import tiny_decoder
        >>> tiny_decoder().config.num_layers
        2
    """
    from .loader import load
    kwargs = {"device": "cpu", "dtype": torch.float32, "max_seq_len": 128, "max_batch": 4, **load_kwargs}
    return load(write_tiny_checkpoint(config, seed), **kwargs)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

#: Llama-3.2-1B's shapes (tied embeddings, llama3 rope scaling); weights are random.
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": _LLAMA3_ROPE, "tie_word_embeddings": True, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": 128001,
}

#: Llama-3-8B's shapes (separate output head, no rope scaling); weights are random.
LLAMA_8B = dict(LLAMA_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
                max_position_embeddings=8192, rope_scaling=None, tie_word_embeddings=False)


def write_random_checkpoint(config: dict[str, Any], directory: Optional[str] = None,
                            device: Any = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> str:
    """A random checkpoint of any size, drawn on ``device`` and saved in ``dtype`` (llama family).

    Scales give a usable model: embedding std 0.1 (tied logits peaked enough for stable greedy
    tokens), projections std 0.02, norms 1 + N(0, 0.1). Returns the directory.

    Example:
        >>> import os
        >>> from opforge.models.testing import TINY_LLAMA, write_random_checkpoint
        >>> sorted(os.listdir(write_random_checkpoint(TINY_LLAMA)))
        ['config.json', 'model.safetensors']
    """
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype).cpu()
    w = _llama_weights(config, r, embed_std=0.1, std=0.02, qwen_extras=False)
    return write_checkpoint(directory or tempfile.mkdtemp(prefix="opforge-random-"), config, w)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m opforge.models.testing DIR``: write the tiny random Llama checkpoint into DIR.

    Example:
        >>> import contextlib, io, os, tempfile
        >>> from opforge.models.testing import main
        >>> d = os.path.join(tempfile.mkdtemp(), "tiny")
        >>> with contextlib.redirect_stdout(io.StringIO()):
        ...     status = main([d])
        >>> status, sorted(os.listdir(d))
        (0, ['config.json', 'model.safetensors'])
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m opforge.models.testing DIR   (writes a tiny random Llama checkpoint)",
              file=sys.stderr)
        return 2
    directory = write_checkpoint(args[0], TINY_LLAMA, random_weights(TINY_LLAMA))
    print(f"wrote a tiny random Llama checkpoint to {directory}; try: "
          f"opforge generate {directory} --prompt-ids 1,2,3 --max-new-tokens 8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
