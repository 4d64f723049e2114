"""What the engine hands back per request: ``RequestOutput`` deltas on a ``RequestStream``.

A stream is filled by the engine's thread and read by one consumer, either blocking
(``for out in stream``) or from an asyncio task (``async for out in stream``); it ends after the
output with ``finished=True``.

Example:
    >>> s = RequestStream("r1")
    >>> s.put(RequestOutput("r1", [5], "a", False, None, 3, 1, 0.01))
    >>> s.put(RequestOutput("r1", [6], "b", True, "length", 3, 2, 0.01))
    >>> [o.new_text for o in s]
    ['a', 'b']
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Optional, Sequence


@dataclass
class RequestOutput:
    """One step's news for one request.

    Attributes:
        request_id: the request's id.
        new_token_ids: tokens generated since the previous output.
        new_text: text released since the previous output (stop strings never appear).
        finished: the last output of the request.
        finish_reason: None until finished; then "stop" (a stop token or string, or end of
            sequence), "length" (max_tokens or max_model_len) or "abort".
        prompt_tokens: tokens in the prompt.
        completion_tokens: tokens generated so far.
        time_to_first_token: seconds from ``add_request`` to the first token (None before it).
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: Optional[str]
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token: Optional[float]


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine: sequences, blocks, prefix cache, steps.

    ``prefix_cache_queries`` and ``prefix_cache_hits`` count prompt positions (of full blocks)
    looked up and found; ``step_time_s`` is the last step's wall time.
    """

    running: int
    waiting: int
    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    step_time_s: float
    steps: int

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class RequestStream:
    """Outputs of one request, iterable (blocking) and async-iterable; ends after the last one.

    ``first_token_at`` and ``last_token_at`` (``time.perf_counter()``) are when outputs with tokens
    arrived; ``prompt_token_ids`` the prompt as the engine tokenized it.
    """

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int] = ()):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.first_token_at: Optional[float] = None
        self.last_token_at: Optional[float] = None
        self._items: deque[RequestOutput] = deque()
        self._ready = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._done = False       # the finished output has been taken
        self._sleepers = 0       # threads blocked in __iter__

    def put(self, output: RequestOutput) -> None:
        """Called by the engine (any thread)."""
        if output.new_token_ids:
            self.last_token_at = time.perf_counter()
            self.first_token_at = self.first_token_at or self.last_token_at
        with self._ready:
            self._items.append(output)
            if self._sleepers:
                self._ready.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def _take(self) -> Optional[RequestOutput]:
        if not self._items:
            return None
        out = self._items.popleft()
        self._done = out.finished
        return out

    def __iter__(self) -> Iterator[RequestOutput]:
        while not self._done:
            with self._ready:
                while not self._items:
                    self._sleepers += 1
                    self._ready.wait()
                    self._sleepers -= 1
                out = self._take()
            yield out

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._async_iter()

    async def _async_iter(self) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        while not self._done:
            with self._ready:
                out = self._take()
                if out is None:
                    future = loop.create_future()
                    self._waiters.append((loop, future))
            if out is None:
                await future
                continue
            yield out


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
