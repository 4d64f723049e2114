"""The checks ``opforge generate`` makes before it loads a model: each returns a one-line reason or None.

Loading a model takes seconds to minutes; a bad argument found after that wastes them, and one
found by the model (a token id past the embedding table) surfaces as a traceback. So every
argument is checked first, from the command line and the checkpoint's ``config.json`` only.

Example:
    >>> from opforge.models.cli_checks import check_token_ids
    >>> check_token_ids([5, 99999], vocab_size=64)
    '--prompt-ids: token id 99999 is outside the vocabulary [0, 64)'
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

from .config import ModelConfig, parse_config
from .gguf import is_gguf, open_checkpoint

#: the group sizes ``opforge.quantize_weight`` takes (-1: one group per row)
GROUP_SIZES = (32, 64, 128, -1)


def check_numbers(max_new_tokens: int, temperature: float, top_k: Optional[int], top_p: Optional[float],
                  max_seq_len: int, readback: int) -> Optional[str]:
    """The sampling and size options, each in its range.

    Example:
        >>> check_numbers(8, -1.0, None, None, 4096, 1)
        '--temperature must be >= 0 (0 is greedy), got -1.0'
        >>> check_numbers(8, 0.7, 40, 0.9, 4096, 1) is None
        True
    """
    if max_new_tokens < 1:
        return f"--max-new-tokens must be >= 1, got {max_new_tokens}"
    if not math.isfinite(temperature) or temperature < 0:
        return f"--temperature must be >= 0 (0 is greedy), got {temperature}"
    if top_k is not None and top_k < 1:
        return f"--top-k must be >= 1, got {top_k}"
    if top_p is not None and not 0 < top_p <= 1:
        return f"--top-p must be in (0, 1], got {top_p}"
    if max_seq_len < 2:
        return f"--max-seq-len must be >= 2 (a prompt token and a new one), got {max_seq_len}"
    if readback < 1:
        return f"--readback takes a number of decode steps >= 1, got {readback}"
    return None


def read_config(model_dir: str) -> tuple[Optional[ModelConfig], Optional[str]]:
    """The checkpoint's parsed ``config.json``, or the reason there is none (a missing directory,
    no config.json, malformed JSON, an unsupported architecture).

    Example:
        >>> read_config("/no/such/model")
        (None, 'MODEL /no/such/model does not exist')
    """
    if not os.path.exists(model_dir):
        return None, f"MODEL {model_dir} does not exist"
    if os.path.isfile(model_dir) and is_gguf(model_dir):
        try:
            return parse_config(open_checkpoint(model_dir).config), None
        except ValueError as exc:   # GGUFError and UnsupportedModelError are ValueErrors
            return None, str(exc).splitlines()[0]
    if not os.path.isdir(model_dir):
        return None, f"MODEL {model_dir} is neither a GGUF file nor a directory (a Hugging Face layout: config.json + *.safetensors)"
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        return None, f"MODEL {model_dir} has no config.json (a Hugging Face layout: config.json + *.safetensors)"
    try:
        with open(path) as f:
            raw = json.load(f)
        return parse_config(raw), None
    except (OSError, ValueError, KeyError, TypeError) as exc:   # UnsupportedModelError is a ValueError
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        return None, f"{path}: {detail}"


def check_token_ids(ids: Sequence[int], vocab_size: int, option: str = "--prompt-ids") -> Optional[str]:
    """Every prompt token id inside the model's vocabulary.

    Example:
        >>> check_token_ids([5, -1], vocab_size=64)
        '--prompt-ids: token id -1 is outside the vocabulary [0, 64)'
    """
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        return f"{option}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})"
    return None


def check_length(prompt_tokens: int, max_new_tokens: int, max_seq_len: int) -> Optional[str]:
    """The prompt and the new tokens fit in ``--max-seq-len``.

    Example:
        >>> check_length(10, 64, 32)
        'the prompt (10 tokens) + --max-new-tokens (64) exceeds --max-seq-len (32)'
    """
    if prompt_tokens + max_new_tokens > max_seq_len:
        what = "the prompt" if prompt_tokens < max_seq_len else "the prompt alone"
        return (f"{what} ({prompt_tokens} tokens) + --max-new-tokens ({max_new_tokens}) exceeds "
                f"--max-seq-len ({max_seq_len})")
    return None


def dense_note(config: ModelConfig, quantize: Optional[str], group_size: int, quantize_head: bool) -> Optional[str]:
    """What ``--quantize`` leaves dense because ``--group-size`` does not divide a projection's
    input dimension (opforge never pads a weight), and which group sizes would quantize all of it.

    Example:
        >>> from opforge.models.config import parse_config
        >>> c = parse_config({"model_type": "llama", "hidden_size": 96, "intermediate_size": 256,
        ...                   "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})
        >>> print(dense_note(c, "int8", 128, False))
        --quantize int8 --group-size 128 leaves these projections dense (their input dimension is not a multiple of 128): q|k|v (96), o (96), gate|up (96); --group-size 32 quantizes them all
    """
    if quantize not in ("int8", "int4") or group_size == -1:     # nothing quantized here, or one group per row
        return None
    inputs = {"q|k|v": config.hidden_size, "o": config.num_heads * config.head_dim,
              "gate|up": config.hidden_size, "down": config.intermediate_size}
    if quantize_head:
        inputs["output head"] = config.hidden_size
    dense = [f"{name} ({k})" for name, k in inputs.items() if k % group_size]
    if not dense:
        return None
    fits = [g for g in GROUP_SIZES if g != -1 and all(k % g == 0 for k in inputs.values())]
    advice = f"--group-size {fits[-1] if fits else '-1 (one group per row)'} quantizes them all"
    return (f"--quantize {quantize} --group-size {group_size} leaves these projections dense (their input "
            f"dimension is not a multiple of {group_size}): {', '.join(dense)}; {advice}")
