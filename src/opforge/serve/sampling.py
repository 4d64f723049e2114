"""Sampling parameters per request, and choosing each request's next token from its logits.

Greedy at temperature 0 (the first maximum, as ``torch.argmax``); otherwise temperature, top-k and
top-p filtering and a draw from the request's own generator, so a seeded request samples the
same tokens whatever else shares its batch.

Example:
    >>> import torch
    >>> params = SamplingParams(max_tokens=4, temperature=0.8, top_k=2, seed=7)
    >>> logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    >>> a = sample_rows(logits, [params], [make_generator(params)])
    >>> b = sample_rows(logits, [params], [make_generator(params)])
    >>> a == b and a[0] in (1, 2)
    True
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    Attributes:
        max_tokens: new tokens at most (>= 1).
        temperature: 0 is greedy; > 0 scales the logits before sampling.
        top_k: keep the k most likely tokens (None: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches p (None: all).
        min_tokens: end-of-sequence and ``stop_token_ids`` are suppressed before this many tokens.
        seed: makes this request's sampling reproducible whatever else is in the batch.
        stop: strings that end the request; matched on the decoded text, not returned.
        stop_token_ids: token ids that end the request (returned as its last token).
        ignore_eos: do not end at the model's end-of-sequence tokens.

    Example:
        >>> SamplingParams(max_tokens=0)
        Traceback (most recent call last):
        ...
        ValueError: max_tokens must be an int >= 1, got 0
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_tokens: int = 0
    seed: Optional[int] = None
    stop: Optional[Union[str, Sequence[str]]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {self.top_p!r}")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an int in [0, max_tokens], got {self.min_tokens!r}")
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be None or an int, got {self.seed!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        ids = tuple(self.stop_token_ids or ())
        if not all(is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be a list of token ids >= 0, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


#: ``argmax_rows``' first stage aims at about this many chunk maxima in all (rows x chunks per row).
#: H100 (``results/h100/2026-11-27-1ed549a/argmax_probe.json``, 128256-wide bf16 rows, GPU time):
#: chunks of 256 at 1 and 8 rows (11.1 / 12.5 us against 15.8 / 16.9 with chunks of 2004), of
#: 1002 at 32 rows (15.1 against 17.2; 256 there: 19.9).
ARGMAX_STAGE_OUTPUTS = 4096


@functools.lru_cache(maxsize=None)
def _argmax_chunk(v: int, rows: int = 1) -> Optional[int]:
    """The chunk of ``argmax_rows``' first stage for ``rows`` rows of ``v`` logits: the smallest
    divisor of ``v`` in 256..2048 that leaves at most ``ARGMAX_STAGE_OUTPUTS`` chunk maxima in
    all (else the largest such divisor), at least 8 chunks per row; None if there is none.

    Example:
        >>> _argmax_chunk(128256), _argmax_chunk(128256, 32), _argmax_chunk(5000)
        (256, 1002, 500)
    """
    divisors = [c for c in range(256, 2049) if v % c == 0 and v // c >= 8]
    if not divisors:
        return None
    return next((c for c in divisors if rows * (v // c) <= ARGMAX_STAGE_OUTPUTS), divisors[-1])


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` for (B, V) logits, the same index (the first maximum), in two stages
    for wide rows: the maxima of chunks of the row, then the first chunk holding the largest.
    Why: one row of 128256 logits is a single-output reduction, and torch's ``argmax`` ran it in
    27.5 us on an H100 (at fed7445, benchmarks/NOTES.md, Models), 2% of a 1B decode step.

    Example:
        >>> import torch
        >>> x = torch.randn(2, 5120)
        >>> torch.equal(argmax_rows(x), x.argmax(-1))
        True
    """
    b, v = logits.shape
    chunk = _argmax_chunk(v, b)
    if chunk is None:
        return logits.argmax(-1)
    best, where = logits.view(b, v // chunk, chunk).max(-1)        # first maximum of each chunk
    first = best.argmax(-1, keepdim=True)                          # first chunk holding the row's maximum
    return (first * chunk + where.gather(-1, first))[:, 0]


def make_generator(params: SamplingParams) -> Optional[random.Random]:
    """The request's own source of uniform draws (None for greedy): seeded by ``params.seed``,
    else at random. One draw per token, on the host, so sampling rows of a batch costs no launch
    per row and a request's draws do not depend on the rest of the batch."""
    if params.greedy:
        return None
    return random.Random(params.seed if params.seed is not None else random.getrandbits(63))


def _draw(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: Sequence[float]) -> torch.Tensor:
    """Tokens (R,) drawn from float logits (R, V) under each row's temperature, top-k and top-p,
    by inverting each row's cumulative distribution at its uniform draw (all rows at once)."""
    r, v = logits.shape
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], device=dev, dtype=torch.float32)
    ks = torch.tensor([min(p.top_k or v, v) for p in params], device=dev)
    ps = torch.tensor([p.top_p or 1.0 for p in params], device=dev, dtype=torch.float32)
    ordered, order = (logits / temps[:, None]).sort(dim=-1, descending=True)
    rank = torch.arange(v, device=dev)[None, :]
    ordered = ordered.masked_fill(rank >= ks[:, None], float("-inf"))                # top-k
    probs = ordered.softmax(-1)
    ahead = probs.cumsum(-1) - probs                                                # mass before each token
    ordered = ordered.masked_fill((ahead >= ps[:, None]) & (rank > 0), float("-inf"))   # top-p (keeps the first)
    probs = ordered.softmax(-1)
    cdf = probs.cumsum(-1)
    u = torch.tensor(uniforms, device=dev, dtype=torch.float32)[:, None] * cdf[:, -1:]
    kept = (ordered > float("-inf")).sum(-1, keepdim=True)
    pick = torch.searchsorted(cdf, u, right=True).clamp_(max=kept - 1)
    return order.gather(-1, pick)[:, 0]


def sample_rows(logits: torch.Tensor, params: Sequence[SamplingParams],
                generators: Sequence[Optional[random.Random]],
                banned: Optional[Sequence[Sequence[int]]] = None) -> list[int]:
    """The next token of each row of ``logits`` (R, V) under its request's parameters.

    ``generators[r]``: row r's ``make_generator`` (None for greedy rows). ``banned[r]``: token ids
    row r may not produce now (end-of-sequence before ``min_tokens``).
    """
    if banned is not None and any(banned):
        logits = logits.clone()
        for r, ids in enumerate(banned):
            if ids:
                logits[r, list(ids)] = float("-inf")
    out = argmax_rows(logits).tolist()
    rows = [r for r, p in enumerate(params) if not p.greedy]
    if rows:
        drawn = _draw(logits[rows].float(), [params[r] for r in rows], [generators[r].random() for r in rows])
        for r, token in zip(rows, drawn.tolist()):
            out[r] = token
    return out


def release_text(held: str, delta: str, stops: Sequence[str]) -> tuple[str, str, bool]:
    """Stop strings on streamed text: ``(released, still_held, stopped)`` after new text ``delta``.

    Text before a stop string is released and the stop string dropped (``stopped``); otherwise
    everything is released except an ending that could be the start of a stop string, which is
    held until the next text decides.

    Example:
        >>> release_text("", "Hello, wo", ["world"])
        ('Hello, ', 'wo', False)
        >>> release_text("wo", "rld!", ["world"])
        ('', '', True)
        >>> release_text("wo", "w!", ["world"])
        ('wow!', '', False)
    """
    pending = held + delta
    found = [i for i in (pending.find(s) for s in stops) if i >= 0]
    if found:
        return pending[:min(found)], "", True
    keep = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(pending)), keep, -1):
            if pending.endswith(s[:k]):
                keep = k
                break
    return pending[:len(pending) - keep], pending[len(pending) - keep:], False
