"""``LLM``: the offline batch API. Many prompts in, their completions out, in order.

The prompts are all queued on one ``Engine`` at once and served by continuous batching, so a
short request does not wait for a long one, and prompts sharing a prefix share its KV cache.

Example:
    >>> from opforge.models.testing import tiny_decoder
    >>> llm = LLM(tiny_decoder(), kv_blocks=32)
    >>> outs = llm.generate([[1, 2, 3], [4, 5, 6, 7]], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5)])
    >>> [len(o.token_ids) for o in outs]
    [2, 5]
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

from .engine import Engine
from .sampling import SamplingParams
from .tokenizer import load_tokenizer

Prompt = Union[str, Sequence[int]]


@dataclass
class CompletionOutput:
    """One prompt's completion.

    Attributes:
        prompt_token_ids: the prompt's tokens.
        token_ids: the generated tokens (a stop token included, a stop string's tokens included).
        text: the generated text ("" without a tokenizer; a stop string not included).
        finish_reason: "stop", "length" or "abort".
        time_to_first_token: seconds from submission to the first token.
        decode_tokens_per_s: this request's tokens after the first per second.
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: Optional[str]
    time_to_first_token: Optional[float]
    decode_tokens_per_s: float


class LLM:
    """A model and an engine for offline generation.

    Args:
        path: a checkpoint directory (Hugging Face layout, see ``opforge.models.load``), or a model
            already loaded.
        device, dtype, quantize: as in ``opforge.models.load``.
        max_num_seqs, max_model_len, block_size, kv_memory_fraction, enable_prefix_caching: as in
            ``Engine``; ``max_model_len`` defaults to the checkpoint's ``max_position_embeddings``
            capped at 4096.
        engine_kwargs: further ``Engine`` arguments (``kv_blocks``, ``max_num_batched_tokens``, ...).
    """

    def __init__(self, path: Union[str, os.PathLike, Any], device: Union[str, torch.device, None] = None,
                 dtype: Optional[torch.dtype] = None, quantize: Optional[str] = None, max_num_seqs: int = 256,
                 max_model_len: Optional[int] = None, block_size: int = 16, kv_memory_fraction: float = 0.9,
                 enable_prefix_caching: bool = True, **engine_kwargs: Any):
        if isinstance(path, (str, os.PathLike)):
            from ..models import load
            path = os.fspath(path)
            if max_model_len is None:
                max_model_len = min(4096, _max_positions(path))
            model = load(path, device=device, dtype=dtype, quantize=quantize, max_seq_len=max_model_len)
            if "tokenizer" not in engine_kwargs and getattr(model, "tokenizer", None) is None:
                engine_kwargs["tokenizer"] = load_tokenizer(path)
        else:
            model = path
        self.model = model
        self.engine = Engine(model, max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=block_size,
                             kv_memory_fraction=kv_memory_fraction, enable_prefix_caching=enable_prefix_caching,
                             **engine_kwargs)
        self._count = 0

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 progress: Optional[bool] = None) -> list[CompletionOutput]:
        """Complete every prompt; outputs in the prompts' order.

        Args:
            prompts: a string or a list of token ids, or a list of those.
            params: one ``SamplingParams`` for all, or one per prompt (default ``SamplingParams()``).
            progress: a progress line on stderr (default: when stderr is a terminal).
        """
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("prompts is empty")
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(f"params: {len(params)} SamplingParams for {len(prompts)} prompts")
        engine = self.engine
        ids = [f"offline-{self._count + i}" for i in range(len(prompts))]
        streams = []
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                streams.append(engine.add_request(rid, prompt, p))
        except Exception:
            for rid in ids[:len(streams)]:
                engine.abort(rid)
            raise
        self._count += len(prompts)
        show = sys.stderr.isatty() if progress is None else progress
        t0, done, tokens = time.perf_counter(), 0, 0
        while engine.has_unfinished():
            got = engine.step()
            tokens += got
            if show:
                done = len(prompts) - sum(1 for r in ids if engine.is_unfinished(r))
                rate = tokens / max(time.perf_counter() - t0, 1e-9)
                print(f"\rgenerate: {done}/{len(prompts)} requests, {tokens} tokens, {rate:.0f} tokens/s",
                      end="", file=sys.stderr, flush=True)
        if show:
            print(file=sys.stderr)
        return [_collect(s) for s in streams]


def _collect(stream: Any) -> CompletionOutput:
    outputs = list(stream)
    token_ids = [t for o in outputs for t in o.new_token_ids]
    decode_s = (stream.last_token_at or 0.0) - (stream.first_token_at or 0.0)
    rate = (len(token_ids) - 1) / decode_s if decode_s > 0 else 0.0
    return CompletionOutput(stream.prompt_token_ids, token_ids, "".join(o.new_text for o in outputs),
                            outputs[-1].finish_reason, outputs[-1].time_to_first_token, rate)


def _max_positions(path: str) -> int:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return int(json.load(f).get("max_position_embeddings", 4096))
    except (OSError, ValueError):
        return 4096
