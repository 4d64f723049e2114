"""The decoder: a Llama-family transformer built from opforge's ops, and its step functions.

Layout. Weights: per layer one fused q|k|v projection and one fused gate|up projection (fewer
launches per decode step). Two KV caches, each used by its own step functions:

- the paged cache (``paged_cache``, ``paged_step``): the serving engine's (``opforge.serve``),
  which ``opforge.generate`` and the servers decode with;
- a static cache (``prefill``, ``decode_step``): one (max_batch, Hkv, max_seq_len, D) tensor per
  layer for k and for v, the layout ``decode_attention`` reads, allocated on the first
  ``prefill`` (the prefill benchmark and the layout tests use it). Batches of prompts of
  different lengths are **right-padded**: every sequence starts at position 0, the causal
  prefill never lets a real token see the padding behind it, and each sequence's
  ``cache_seqlens[b]`` is its own length, so a decode step appends each sequence's token at its
  own position and the padding left in the cache is overwritten before anything reads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .. import api as opforge

from .config import ModelConfig, rope_tables


@dataclass
class Layer:
    """One decoder layer's weights (``qkv`` and ``gate_up`` fused; dense or quantized)."""

    attn_norm: torch.Tensor
    qkv: Any
    qkv_bias: Optional[torch.Tensor]
    o: Any
    mlp_norm: torch.Tensor
    gate_up: Any
    down: Any
    q_norm: Optional[torch.Tensor] = None
    k_norm: Optional[torch.Tensor] = None


@dataclass
class PagedCache:
    """The page pools of a paged KV cache: per layer one K and one V (num_blocks, block_size, Hkv, D)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]


class Decoder:
    """A loaded model: weights, rope tables, and ``forward``, ``paged_step`` (the serving engine's
    model call), ``prefill``/``decode_step`` (over the static cache).

    Made by ``opforge.models.load``; ``opforge.generate`` (``opforge.serve``) decodes with it.

    Example:
        >>> import torch
        >>> from opforge.models.testing import tiny_decoder
        >>> model = tiny_decoder()
        >>> model.forward(torch.tensor([[1, 2, 3]])).shape
        torch.Size([1, 3, 64])
    """

    #: the checkpoint's ``tokenizers.Tokenizer`` and Jinja chat template (set by ``load``; None if absent)
    tokenizer: Any = None
    chat_template: Optional[str] = None
    #: state a client keeps for the model's lifetime (``opforge.serve.generate`` keeps its engine
    #: here, so repeated calls reuse its KV cache and CUDA graphs); None until a client sets it
    client_state: Any = None

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[Layer], norm: torch.Tensor,
                 lm_head: Any, *, max_seq_len: int, max_batch: int, device: torch.device, dtype: torch.dtype):
        self.config, self.embed, self.layers, self.norm, self.lm_head = config, embed, layers, norm, lm_head
        self.max_seq_len, self.max_batch, self.device, self.dtype = max_seq_len, max_batch, device, dtype
        self.cos, self.sin = rope_tables(config, max_seq_len, device)
        self._static: Optional[tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]] = None
        self.scale = config.head_dim ** -0.5
        # CPU: the ops always check cache ranges. CUDA: never read seqlens on the host (graph capture,
        # no sync per step); prefill checks sizes itself, and the callers keep seqlens in range.
        self._check = None if device.type != "cuda" else False

    # ---- the static KV cache (allocated on first use) -------------------------------------------
    def _static_cache(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        if self._static is None:
            c = self.config
            shape = (self.max_batch, c.num_kv_heads, self.max_seq_len, c.head_dim)
            self._static = ([torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers],
                            [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers],
                            torch.zeros(self.max_batch, device=self.device, dtype=torch.int32))
        return self._static

    @property
    def k_cache(self) -> list[torch.Tensor]:
        """The static cache's keys: per layer (max_batch, Hkv, max_seq_len, D)."""
        return self._static_cache()[0]

    @property
    def v_cache(self) -> list[torch.Tensor]:
        """The static cache's values, shaped as ``k_cache``."""
        return self._static_cache()[1]

    @property
    def cache_seqlens(self) -> torch.Tensor:
        """(max_batch,) int32: positions filled in the static cache, per sequence."""
        return self._static_cache()[2]

    # ---- one layer ---------------------------------------------------------------------------
    def _project_qkv(self, layer: Layer, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q (B, Hq, S, D), k and v (B, Hkv, S, D) as views of one projection, not yet rotated."""
        c = self.config
        b, s, _ = y.shape
        qkv = opforge.linear(y, layer.qkv, layer.qkv_bias).view(b, s, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
        q, k, v = qkv.split([c.num_heads, c.num_kv_heads, c.num_kv_heads], dim=2)
        if c.qk_norm:
            q, k = opforge.rms_norm(q, layer.q_norm, c.rms_norm_eps), opforge.rms_norm(k, layer.k_norm, c.rms_norm_eps)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)             # (B, H, S, D) views

    def _qkv(self, layer: Layer, y: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = self._project_qkv(layer, y)
        q, k = opforge.rotary_embedding(q, k, self.cos, self.sin, positions)
        return q, k, v

    def _mlp(self, layer: Layer, y: torch.Tensor) -> torch.Tensor:
        # SwiGLU in the gate|up projection's call: one launch at one row of dense bf16/fp16 x on CUDA
        # (the dense GEMV applies it to its sums); its own kernel elsewhere
        return opforge.linear(opforge.linear(y, layer.gate_up, activation="swiglu"), layer.down)

    def _out(self, layer: Layer, attn: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = attn.shape
        return opforge.linear(attn.transpose(1, 2).reshape(b, s, -1), layer.o)

    def _run(self, ids: torch.Tensor, attend) -> torch.Tensor:
        """Embedding, the layers (``attend(i, layer, y)`` gives the attention output), final norm."""
        eps = self.config.rms_norm_eps
        h = self.embed[ids]
        y = opforge.rms_norm(h, self.layers[0].attn_norm, eps)
        for i, layer in enumerate(self.layers):
            y, h = opforge.add_rms_norm(attend(i, layer, y), h, layer.mlp_norm, eps)
            following = self.layers[i + 1].attn_norm if i + 1 < len(self.layers) else self.norm
            y, h = opforge.add_rms_norm(self._mlp(layer, y), h, following, eps)
        return y

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """Final hidden states (already normalized) to logits."""
        return opforge.linear(y, self.lm_head)

    # ---- whole sequences, no cache -------------------------------------------------------------
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, S, V) for full sequences, without touching the KV cache (the test oracle).

        Example:
            >>> import torch
            >>> from opforge.models.testing import tiny_decoder
            >>> tiny_decoder().forward(torch.tensor([[5, 6]])).dtype
            torch.float32
        """
        ids = ids.to(self.device)
        positions = torch.arange(ids.shape[1], device=self.device, dtype=torch.int32)[None].expand(ids.shape[0], -1)

        def attend(i: int, layer: Layer, y: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(layer, y, positions)
            return self._out(layer, opforge.attention(q, k, v, causal=True, scale=self.scale))
        return self.logits(self._run(ids, attend))

    # ---- prefill into the cache -------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Right-padded prompts (B, S) with true ``lengths`` (B,) into an empty cache.

        Returns each sequence's logits at its last real token, (B, V) float32; afterwards
        ``cache_seqlens[:B] == lengths``.
        """
        b, s = ids.shape
        if b > self.max_batch or s > self.max_seq_len:
            raise ValueError(f"prompt batch {b}x{s} exceeds the cache (max_batch={self.max_batch}, "
                             f"max_seq_len={self.max_seq_len})")
        ids, lengths = ids.to(self.device), lengths.to(self.device, torch.int32)
        seqlens = self.cache_seqlens[:b]
        seqlens.zero_()
        positions = torch.arange(s, device=self.device, dtype=torch.int32)[None].expand(b, -1)

        def attend(i: int, layer: Layer, y: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(layer, y, positions)
            # the sizes were checked above: no host read of seqlens on a GPU
            opforge.kv_cache_append(self.k_cache[i][:b], self.v_cache[i][:b], k, v, seqlens, check=self._check)
            return self._out(layer, opforge.attention(q, k, v, causal=True, scale=self.scale))
        y = self._run(ids, attend)
        last = y[torch.arange(b, device=self.device), lengths.long() - 1]
        seqlens.copy_(lengths)
        return self.logits(last).float()

    # ---- one decode step over the static cache (a pure function of its inputs: capturable) -----------
    def decode_step(self, tokens: torch.Tensor, seqlens: torch.Tensor, float_logits: bool = True) -> torch.Tensor:
        """Append one token per sequence at ``seqlens[b]`` and return logits (B, V), float32 (or in
        the model's dtype with ``float_logits=False``: greedy decoding needs no float copy).

        ``seqlens`` is ``cache_seqlens[:B]``; it is NOT advanced here (the caller does it), so the
        step is a pure function of its static inputs and can be captured and replayed.
        """
        b = tokens.shape[0]
        total = seqlens + 1

        def attend(i: int, layer: Layer, y: torch.Tensor) -> torch.Tensor:
            q, k, v = self._project_qkv(layer, y)
            # one pass: rotate q and k at position seqlens[b], write k and v into the cache there
            q = opforge.rotary_kv_cache_append(q, k, v, self.k_cache[i][:b], self.v_cache[i][:b], seqlens,
                                               self.cos, self.sin, check=self._check)
            return self._out(layer, opforge.decode_attention(q, self.k_cache[i][:b], self.v_cache[i][:b], total,
                                                         scale=self.scale))
        logits = self.logits(self._run(tokens[:, None], attend)[:, 0])
        return logits.float() if float_logits else logits

    # ---- one step over a paged cache (the serving engine's model call) -------------------------------
    def paged_step(self, tokens: torch.Tensor, cache: "PagedCache", block_tables: torch.Tensor,
                   cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, max_query_len: int,
                   logit_rows: torch.Tensor, float_logits: bool = True) -> torch.Tensor:
        """One model call over the packed new tokens of a step: prefill chunks and decode tokens.

        Sequence ``b`` owns tokens ``cu_seqlens[b]:cu_seqlens[b + 1]`` of ``tokens`` (T,); they go
        to its positions ``cache_seqlens[b] + i`` (the positions filled before the call) in the
        blocks ``block_tables[b]`` of ``cache``. Returns the logits of the rows ``logit_rows``
        (R,) of the packed tokens, (R, V) float32 (or the model's dtype with ``float_logits=False``).
        ``cache_seqlens`` is not advanced (the caller does it), so the step is a pure function of
        its inputs and can be captured in a CUDA graph (with ``max_query_len`` fixed).

        Example:
            >>> import torch
            >>> from opforge.models.testing import tiny_decoder
            >>> model = tiny_decoder()
            >>> cache = model.paged_cache(num_blocks=4, block_size=4)
            >>> ids = torch.tensor([[5, 6, 7]])
            >>> i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
            >>> logits = model.paged_step(ids[0], cache, i32([1]), i32(0), i32(0, 3), 3, torch.tensor([2]))
            >>> torch.allclose(logits, model.forward(ids)[0, 2:], atol=1e-5)
            True
        """
        c = self.config
        t = tokens.shape[0]
        total = cache_seqlens + (cu_seqlens[1:] - cu_seqlens[:-1])

        def attend(i: int, layer: Layer, y: torch.Tensor) -> torch.Tensor:
            qkv = opforge.linear(y, layer.qkv, layer.qkv_bias).view(t, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
            q, k, v = qkv.split([c.num_heads, c.num_kv_heads, c.num_kv_heads], dim=1)
            if c.qk_norm:
                q, k = opforge.rms_norm(q, layer.q_norm, c.rms_norm_eps), opforge.rms_norm(k, layer.k_norm, c.rms_norm_eps)
            q = opforge.paged_rotary_kv_cache_append(q, k, v, cache.k[i], cache.v[i], block_tables, cache_seqlens,
                                                     cu_seqlens, self.cos, self.sin, check=self._check)
            out = opforge.paged_attention(q, cache.k[i], cache.v[i], block_tables, total, cu_seqlens,
                                          max_query_len=max_query_len, scale=self.scale)
            return opforge.linear(out.reshape(t, -1), layer.o)
        logits = self.logits(self._run(tokens, attend)[logit_rows])
        return logits.float() if float_logits else logits

    def paged_cache(self, num_blocks: int, block_size: int) -> "PagedCache":
        """Empty K and V page pools for ``paged_step``: per layer (num_blocks, block_size, Hkv, D).

        Example:
            >>> from opforge.models.testing import tiny_decoder
            >>> tiny_decoder().paged_cache(8, 16).k[0].shape
            torch.Size([8, 16, 2, 8])
        """
        shape = (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        return PagedCache(k=[torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers],
                          v=[torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers])

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V of one position over all layers."""
        return 2 * len(self.layers) * self.config.num_kv_heads * self.config.head_dim * \
            torch.empty((), dtype=self.dtype).element_size()

    def weight_bytes(self) -> int:
        """Bytes of every weight a decode step reads (for the bandwidth limit).

        The embedding table counts only as the output head (a step reads one row of it per token).
        """
        total = 0
        for obj in [self.norm, self.lm_head] + \
                [getattr(layer, f) for layer in self.layers for f in Layer.__dataclass_fields__]:
            total += _nbytes(obj)
        return total


def _nbytes(obj: Any) -> int:
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    return sum(_nbytes(v) for v in vars(obj).values() if isinstance(v, torch.Tensor))
