"""``opforge.models.load``: a Hugging Face layout directory to a ``Decoder``."""
from __future__ import annotations

import glob
import json
import os
import warnings
from typing import Any, Optional, Union

import torch

from .. import api as opforge

from .config import UnsupportedModelError, parse_config
from .decoder import Decoder, Layer
from .gguf import is_gguf, open_checkpoint
from .tokenizer import hf_tokenizer

_QUANTIZE = {"dense": None, "int8": 8, "int4": 4}


def default_quantize(path: Union[str, os.PathLike], device: Union[str, torch.device]) -> Optional[str]:
    """The ``quantize`` the command-line tools load ``path`` with when the user names none:
    ``"dense"`` for a GGUF file on a CPU (its quantized weights are dequantized once, at load,
    instead of in every step's torch path: 3.8 vs 0.8 decode tokens/s for SmolLM2-135M on a
    2-core CPU), else None (the weights as stored).

    Example:
        >>> default_quantize("/no/such/dir", "cpu") is None
        True
    """
    return "dense" if torch.device(device).type == "cpu" and is_gguf(path) else None


def load(path: Union[str, os.PathLike], device: Union[str, torch.device, None] = None,
         dtype: Optional[torch.dtype] = None, quantize: Optional[str] = None, max_seq_len: int = 4096,
         max_batch: int = 1, group_size: int = 128, quantize_head: bool = False,
         int4_layout: Optional[str] = None) -> Decoder:
    """Load a Llama/Mistral/Qwen2/Qwen3 checkpoint: a Hugging Face directory (``config.json`` +
    ``*.safetensors``) or a GGUF file (llama.cpp's; architectures llama, mistral, qwen2, qwen3).

    The model carries its tokenizer as ``model.tokenizer`` (a ``tokenizers.Tokenizer``: the
    directory's ``tokenizer.json`` or the GGUF file's vocabulary; None when there is none or
    the ``tokenizers`` package is missing) and ``model.chat_template`` (Jinja text or None).

    Args:
        path: a directory in the Hugging Face layout, or a ``.gguf`` file.
        device: default ``opforge.device_config().device`` (CUDA, then MPS, then CPU).
        dtype: compute dtype; default the device's (bf16 where supported, else fp16; CPU float32).
        quantize: the layers' projections (embedding and norms are always dense):
            None: as the checkpoint stores them (a GGUF file's Q8_0/Q4_0/Q4_1/K-quant weights
            become ``opforge.QuantizedWeight`` holding the file's codes, see
            ``opforge.io.gguf_blocks``; its head too, if quantized); ``"dense"``: dequantized to
            ``dtype``; ``"int8"`` or ``"int4"``: quantized by opforge from the float weights
            (a GGUF file's quantized ones first dequantized), the head dense unless ``quantize_head``.
        max_seq_len, max_batch: the longest sequence (rope tables, the engine's ``max_model_len`` at
            most) and the static cache's batch (allocated by the first ``prefill``).
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
    if quantize is not None and quantize not in _QUANTIZE:
        raise ValueError(f"quantize must be None, 'dense', 'int8' or 'int4', got {quantize!r}")
    if int4_layout is not None and int4_layout not in opforge.QuantizedWeight.LAYOUTS:
        raise ValueError(f"int4_layout must be None or one of {opforge.QuantizedWeight.LAYOUTS}, got {int4_layout!r}")
    checkpoint = open_checkpoint(path) if is_gguf(path) else None
    if checkpoint is not None:
        config = parse_config(checkpoint.config)
    else:
        with open(os.path.join(path, "config.json")) as f:
            config = parse_config(json.load(f))
    if config.sliding_window is not None and config.sliding_window < max_seq_len:
        raise UnsupportedModelError(f"sliding_window={config.sliding_window} < max_seq_len={max_seq_len}: "
                                    "sliding-window attention is not supported; lower max_seq_len")
    dc = device_config(device)
    device = torch.device(dc.device)
    dtype = dtype or dc.dtype
    if checkpoint is not None:
        tensors = checkpoint.tensors(device, dtype)
        tokenizer, chat_template = checkpoint.tokenizer, checkpoint.chat_template
    else:
        tensors = _safetensors(path, device, dtype)
        tokenizer, chat_template = hf_tokenizer(path)

    def take(name: str, required: bool = True) -> Optional[torch.Tensor]:
        if name not in tensors:
            if required:
                raise UnsupportedModelError(f"weight {name!r} missing from {path}")
            return None
        return tensors.pop(name)

    kept_dense: list[str] = []

    def dense(w: Any) -> torch.Tensor:
        return w.dequantize(dtype) if isinstance(w, opforge.QuantizedWeight) else w

    def laid_out(w: Any) -> Any:
        if not isinstance(w, opforge.QuantizedWeight) or w.bits != 4:
            return w
        return opforge.repack(w, int4_layout or opforge.preferred_layout(w, device))

    def project(w: Any, name: str) -> Any:
        if quantize is None:
            return laid_out(w)
        if quantize == "dense":
            return dense(w)
        if w.shape[1] % group_size:         # opforge never pads K; such a weight stays dense
            kept_dense.append(name)
            return dense(w)
        if isinstance(w, opforge.QuantizedWeight):    # requantized from its float32 values
            w = w.dequantize(torch.float32)
        return laid_out(opforge.quantize_weight(w, _QUANTIZE[quantize], group_size))

    layers = []
    for i in range(config.num_layers):
        p = f"layers.{i}."
        qkv = concat_rows([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        biases = [take(p + f"self_attn.{n}_proj.bias", required=False) for n in "qkv"]
        if any(b is not None for b in biases) and not all(b is not None for b in biases):
            raise UnsupportedModelError(f"layer {i}: bias on some of q/k/v projections only")
        gate_up = concat_rows([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        layers.append(Layer(
            attn_norm=take(p + "input_layernorm.weight"), qkv=project(qkv, p + "qkv"),
            qkv_bias=torch.cat(biases) if biases[0] is not None else None,
            o=project(take(p + "self_attn.o_proj.weight"), p + "o"),
            mlp_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=project(gate_up, p + "gate_up"),
            down=project(take(p + "mlp.down_proj.weight"), p + "down"),
            q_norm=take(p + "self_attn.q_norm.weight") if config.qk_norm else None,
            k_norm=take(p + "self_attn.k_norm.weight") if config.qk_norm else None))
    stored_embed = take("embed_tokens.weight")
    embed = dense(stored_embed)                    # a lookup table: dense
    head = take("lm_head.weight", required=not config.tie_word_embeddings)
    stored_head = stored_embed if head is None else head
    if quantize is None:                           # as stored: a GGUF file's head may be quantized
        lm_head = laid_out(stored_head)
    elif quantize_head and quantize != "dense":
        lm_head = project(stored_head, "lm_head")
    else:
        lm_head = dense(stored_head)
    if head is None and not isinstance(lm_head, opforge.QuantizedWeight):
        lm_head = embed                            # tied: one table
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
    model.tokenizer = tokenizer
    model.chat_template = chat_template
    return model


def _safetensors(path: str, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(opforge.load_safetensors(file, device=device, dtype=dtype))
    return {k.removeprefix("model."): v for k, v in tensors.items()}


def concat_rows(parts: list[Any]) -> Any:
    """Stack projections' rows (q|k|v, gate|up): dense with ``torch.cat``, quantized with
    ``QuantizedWeight.concat`` (exact across forms); a mix becomes dense."""
    if all(isinstance(p, opforge.QuantizedWeight) for p in parts):
        return opforge.QuantizedWeight.concat(parts)
    dtype = next((p.dtype for p in parts if isinstance(p, torch.Tensor)), torch.float32)
    return torch.cat([p.dequantize(dtype) if isinstance(p, opforge.QuantizedWeight) else p for p in parts])
