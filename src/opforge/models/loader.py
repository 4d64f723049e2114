"""``opforge.models.load``: a Hugging Face layout directory to a ``Decoder``."""
from __future__ import annotations

import glob
import json
import os
import warnings
from typing import Any, Optional, Union

import torch

import opforge

from .config import UnsupportedModelError, parse_config
from .decoder import Decoder, Layer

_QUANT_BITS = {"int8": 8, "int4": 4}


def load(path: Union[str, os.PathLike], device: Union[str, torch.device, None] = None,
         dtype: Optional[torch.dtype] = None, quantize: Optional[str] = None, max_seq_len: int = 4096,
         max_batch: int = 1, group_size: int = 128, quantize_head: bool = False) -> Decoder:
    """Load a Llama/Mistral/Qwen2/Qwen3 checkpoint (``config.json`` + ``*.safetensors``).

    Args:
        path: a directory in the Hugging Face layout.
        device: default ``opforge.device_config().device`` (CUDA, then MPS, then CPU).
        dtype: compute dtype; default the device's (bf16 where supported, else fp16; CPU float32).
        quantize: None, ``"int8"`` or ``"int4"``: the layers' projections become
            ``opforge.QuantizedWeight`` (embedding, norms and the output head stay dense).
        max_seq_len, max_batch: the static KV cache, preallocated here.
        group_size: quantization group along the input dimension.
        quantize_head: with ``quantize``, also quantize the output head (the largest single
            weight a decode step reads: 0.53 GB of the 1B model's 2.47). With tied embeddings
            the embedding table stays dense for the lookup and the head is a quantized copy of it.

    Raises:
        UnsupportedModelError: an architecture or config field this decoder does not implement,
            named in the message.

    Example:
        >>> import torch
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> from opforge.models import load
        >>> model = load(write_tiny_checkpoint(), device="cpu", dtype=torch.float32, max_seq_len=64)
        >>> model.config.model_type, len(model.layers)
        ('llama', 2)
    """
    from ..runtime.device_config import device_config
    path = os.fspath(path)
    with open(os.path.join(path, "config.json")) as f:
        config = parse_config(json.load(f))
    if config.sliding_window is not None and config.sliding_window < max_seq_len:
        raise UnsupportedModelError(f"sliding_window={config.sliding_window} < max_seq_len={max_seq_len}: "
                                    "sliding-window attention is not supported; lower max_seq_len")
    if quantize is not None and quantize not in _QUANT_BITS:
        raise ValueError(f"quantize must be None, 'int8' or 'int4', got {quantize!r}")
    dc = device_config(device)
    device = torch.device(dc.device)
    dtype = dtype or dc.dtype
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(opforge.load_safetensors(file, device=device, dtype=dtype))
    tensors = {k.removeprefix("model."): v for k, v in tensors.items()}

    def take(name: str, required: bool = True) -> Optional[torch.Tensor]:
        if name not in tensors:
            if required:
                raise UnsupportedModelError(f"weight {name!r} missing from {path}")
            return None
        return tensors.pop(name)

    kept_dense: list[str] = []

    def project(w: torch.Tensor, name: str) -> Any:
        if quantize is None:
            return w
        if w.shape[1] % group_size:         # opforge never pads K; such a weight stays dense
            kept_dense.append(name)
            return w
        return opforge.quantize_weight(w, _QUANT_BITS[quantize], group_size)

    layers = []
    for i in range(config.num_layers):
        p = f"layers.{i}."
        qkv = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        biases = [take(p + f"self_attn.{n}_proj.bias", required=False) for n in "qkv"]
        if any(b is not None for b in biases) and not all(b is not None for b in biases):
            raise UnsupportedModelError(f"layer {i}: bias on some of q/k/v projections only")
        gate_up = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        layers.append(Layer(
            attn_norm=take(p + "input_layernorm.weight"), qkv=project(qkv, p + "qkv"),
            qkv_bias=torch.cat(biases) if biases[0] is not None else None,
            o=project(take(p + "self_attn.o_proj.weight"), p + "o"),
            mlp_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=project(gate_up, p + "gate_up"),
            down=project(take(p + "mlp.down_proj.weight"), p + "down"),
            q_norm=take(p + "self_attn.q_norm.weight") if config.qk_norm else None,
            k_norm=take(p + "self_attn.k_norm.weight") if config.qk_norm else None))
    embed = take("embed_tokens.weight")
    head = take("lm_head.weight", required=not config.tie_word_embeddings)
    lm_head = embed if head is None else head
    if quantize_head and quantize is not None:
        lm_head = project(lm_head, "lm_head")
    norm = take("norm.weight")
    leftover = sorted(k for k in tensors if not k.endswith("rotary_emb.inv_freq"))   # o_proj/mlp biases land here
    if leftover:
        raise UnsupportedModelError(f"weights this decoder does not use (a different architecture?): "
                                    f"{', '.join(leftover[:8])}{' ...' if len(leftover) > 8 else ''}")
    if kept_dense:
        warnings.warn(f"quantize={quantize!r}: {len(kept_dense)} weights whose input dimension group_size="
                      f"{group_size} does not divide stay dense ({', '.join(kept_dense[:4])}...)", stacklevel=2)
    model = Decoder(config, embed, layers, norm, lm_head, max_seq_len=max_seq_len, max_batch=max_batch,
                    device=device, dtype=dtype)
    model.quantize = quantize
    return model
