"""A GGUF file as a checkpoint for ``opforge.models.load``: its metadata as a Hugging Face style
config, its tensors under Hugging Face names, llama.cpp's q/k row order undone.

llama.cpp stores the rows of a Llama/Mistral q and k projection with the two halves of every
head interleaved (its rotary pairs adjacent elements, Hugging Face's pairs element i with
i + head_dim/2). Putting the rows back moves whole rows, so quantized weights keep their codes.
Qwen2/Qwen3 files are not permuted.

Example:
    >>> import torch
    >>> from opforge.models.gguf import unpermute_rows
    >>> unpermute_rows(torch.arange(4.0).view(4, 1), 1).view(-1).tolist()   # one head of 4: 0 2 | 1 3
    [0.0, 2.0, 1.0, 3.0]
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Optional, Union

import torch

from .. import api as opforge
from opforge.io.errors import GGUFError
from opforge.io.gguf import GGUFFile, decode_tensor, open_gguf
from opforge.io.gguf_tokenizer import TokenizerMetadataError, chat_template_from_metadata, tokenizer_from_metadata

#: GGUF ``general.architecture`` -> Hugging Face ``model_type``, and whether q/k rows are permuted.
ARCHITECTURES = {"llama": ("llama", True), "mistral": ("mistral", True), "qwen2": ("qwen2", False),
                 "qwen3": ("qwen3", False)}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
_TOP_NAMES = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
              "output.weight": "lm_head.weight"}


def is_gguf(path: Union[str, os.PathLike]) -> bool:
    """True for a file that starts with GGUF's magic.

    Example:
        >>> is_gguf("/")
        False
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def hf_name(name: str) -> str:
    """A GGUF tensor name as Hugging Face's (``blk.3.attn_q.weight`` -> ``layers.3.self_attn.q_proj.weight``);
    unknown names come back unchanged (the loader then reports them as unused).

    Example:
        >>> hf_name("blk.3.attn_q.weight"), hf_name("token_embd.weight")
        ('layers.3.self_attn.q_proj.weight', 'embed_tokens.weight')
    """
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return name


def unpermute_rows(w: Any, heads: int) -> Any:
    """Rows of a llama.cpp q/k projection (dense or ``QuantizedWeight``) back in Hugging Face's order:
    within each head, rows (0, 2, 4, ..., 1, 3, 5, ...) of the file's order."""
    n = w.shape[0]
    order = torch.arange(n).view(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)
    if isinstance(w, opforge.QuantizedWeight):
        return w.select_rows(order.to(w.device))
    return w.index_select(0, order.to(w.device))


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str], path: str) -> dict[str, Any]:
    """The Hugging Face ``config.json`` fields the file's metadata describes."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"architecture {arch!r} (general.architecture) is not supported "
                        f"({', '.join(ARCHITECTURES)})", path)

    def get(key: str, default: Any = None, required: bool = True) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None and required:
            raise GGUFError(f"metadata {arch}.{key} missing", path)
        return value

    if "rope_freqs.weight" in tensor_names:
        raise GGUFError("per-frequency rope factors (as in Llama 3.1+ files) are not supported", path,
                        "rope_freqs.weight")
    heads = get("attention.head_count")
    hidden = get("embedding_length")
    head_dim = get("attention.key_length", hidden // heads, required=False)
    if get("rope.dimension_count", head_dim, required=False) != head_dim:
        raise GGUFError(f"partial rotary ({arch}.rope.dimension_count={get('rope.dimension_count')} of "
                        f"head_dim {head_dim}) is not supported", path)
    scaling = None
    kind = get("rope.scaling.type", "none", required=False)
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif kind not in ("none", None):
        raise GGUFError(f"{arch}.rope.scaling.type {kind!r} is not supported (linear or none)", path)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = [i for i in (eos, eot) if i is not None]
    tokens = meta.get("tokenizer.ggml.tokens")
    config = {
        "model_type": ARCHITECTURES[arch][0], "hidden_size": hidden, "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"), "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads, required=False), "head_dim": head_dim,
        "vocab_size": get("vocab_size", len(tokens) if tokens else None),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0, required=False)), "rope_scaling": scaling,
        "max_position_embeddings": get("context_length", 4096, required=False),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "eos_token_id": sorted(set(eos_ids)) or None,
    }
    window = get("attention.sliding_window", None, required=False)
    if window:
        config["sliding_window"] = window
    return config


class GGUFCheckpoint:
    """A GGUF file read for a model: ``config`` (Hugging Face fields), ``tokenizer``,
    ``chat_template``, and ``tensors(device, dtype)`` under Hugging Face names."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = os.fspath(path)
        self.file: GGUFFile = open_gguf(self.path)
        meta = self.file.metadata
        self.config = config_from_metadata(meta, {t.name for t in self.file.tensors}, self.path)
        self.architecture = meta["general.architecture"]
        try:
            self.tokenizer = tokenizer_from_metadata(meta)
        except TokenizerMetadataError as e:       # the weights still run on token ids
            warnings.warn(f"{self.path}: no tokenizer: {e}", stacklevel=3)
            self.tokenizer = None
        self.chat_template: Optional[str] = chat_template_from_metadata(meta)

    def tensors(self, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        """Every tensor under its Hugging Face name on ``device``: dense ones in ``dtype``,
        ggml block formats as ``QuantizedWeight``; q/k rows in Hugging Face's order."""
        permuted = ARCHITECTURES[self.architecture][1]
        heads = {"q_proj": self.config["num_attention_heads"], "k_proj": self.config["num_key_value_heads"]}
        out = {}
        for info in self.file.tensors:          # checked by open_gguf: types known, bytes in the file
            t = decode_tensor(info, self.path)
            name = hf_name(info.name)
            proj = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
            if permuted and proj in heads:
                t = unpermute_rows(t, heads[proj])
            out[name] = t.to(device) if isinstance(t, opforge.QuantizedWeight) else t.to(device, dtype)
        return out


@functools.lru_cache(maxsize=1)
def _cached(path: str, mtime_ns: int, size: int) -> GGUFCheckpoint:
    return GGUFCheckpoint(path)


def open_checkpoint(path: Union[str, os.PathLike]) -> GGUFCheckpoint:
    """``GGUFCheckpoint(path)``, the last one kept (while the file is unchanged): a tokenizer read
    before the model (as ``opforge generate`` does) does not parse the header twice."""
    path = os.path.abspath(os.fspath(path))
    st = os.stat(path)
    return _cached(path, st.st_mtime_ns, st.st_size)
