"""What the engine hands back per request: ``RequestOutput`` deltas on a ``RequestStream``.

A stream is filled by the engine's thread and read by one consumer, either blocking
(``for out in stream``) or from an asyncio task (``async for out in stream``, or
``async for outs in stream.updates()`` for every output queued since the last look at once); it
ends after the output with ``finished=True``. Asyncio consumers are woken through one call into
their event loop per burst of outputs (all the streams a step fills), not one per output.

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
import weakref
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
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiter: Optional[tuple[LoopWaker, asyncio.Future]] = None   # an asyncio consumer waiting
        self._done = False       # the finished output has been taken
        self._sleepers = 0       # threads blocked in __iter__

    def put(self, output: RequestOutput) -> None:
        """Called by the engine (any thread)."""
        if output.new_token_ids:
            self.last_token_at = time.perf_counter()
            self.first_token_at = self.first_token_at or self.last_token_at
        with self._lock:
            self._items.append(output)
            if self._sleepers:
                self._ready.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter[0].wake(waiter[1])

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
        async for outs in self.updates():
            for out in outs:
                yield out

    async def updates(self) -> AsyncIterator[list[RequestOutput]]:
        """Every output queued since the previous list, as one list (never empty); the last list
        ends with the finished output. A consumer that falls behind catches up in one go.

        Example:
            >>> s = RequestStream("r1")
            >>> for i in range(3):
            ...     s.put(RequestOutput("r1", [i], str(i), i == 2, "length" if i == 2 else None, 1, i + 1, 0.0))
            >>> async def lists():
            ...     return [[o.new_text for o in outs] async for outs in s.updates()]
            >>> asyncio.run(lists())
            [['0', '1', '2']]
        """
        waker = LoopWaker.of(asyncio.get_running_loop())
        while not self._done:
            with self._lock:
                outs = list(self._items)
                self._items.clear()
                if outs:
                    self._done = outs[-1].finished
                else:
                    future = waker.loop.create_future()
                    self._waiter = (waker, future)
            if not outs:
                await future
                continue
            yield outs


def merge_outputs(outs: Sequence[RequestOutput]) -> RequestOutput:
    """One output standing for consecutive outputs of a request: their tokens and text joined,
    the counts, finish and time to first token of the last.

    Example:
        >>> a = RequestOutput("r1", [5], "a", False, None, 3, 1, 0.01)
        >>> b = RequestOutput("r1", [6, 7], "bc", True, "stop", 3, 3, 0.01)
        >>> m = merge_outputs([a, b])
        >>> m.new_token_ids, m.new_text, m.finish_reason, m.completion_tokens
        ([5, 6, 7], 'abc', 'stop', 3)
    """
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    return RequestOutput(last.request_id, [t for o in outs for t in o.new_token_ids], "".join(o.new_text for o in outs),
                         last.finished, last.finish_reason, last.prompt_tokens, last.completion_tokens,
                         last.time_to_first_token)


class LoopWaker:
    """Resolves futures of one event loop from other threads with one call into the loop per burst:
    the first ``wake`` schedules a callback, later ones before it runs only join its list. (A call
    per output costs the engine's thread a write to the loop's self-pipe each, and wakes the loop's
    thread, which then competes for the GIL with the thread that fills the streams.)

    Example:
        >>> async def demo():
        ...     waker = LoopWaker.of(asyncio.get_running_loop())
        ...     futures = [waker.loop.create_future() for _ in range(3)]
        ...     for f in futures:
        ...         waker.wake(f)
        ...     await asyncio.gather(*futures)
        ...     return waker.calls
        >>> asyncio.run(demo())
        1
    """

    _by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker]" = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._futures: list[asyncio.Future] = []
        self.calls = 0           # callbacks scheduled into the loop so far

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> "LoopWaker":
        """The waker of ``loop`` (one per loop)."""
        with cls._registry_lock:
            waker = cls._by_loop.get(loop)
            if waker is None:
                waker = cls._by_loop[loop] = cls(loop)
            return waker

    def wake(self, future: asyncio.Future) -> None:
        """Resolve ``future`` (with None) in its loop soon; callable from any thread."""
        with self._lock:
            self._futures.append(future)
            if len(self._futures) > 1:
                return           # a callback is scheduled and has not taken the list yet
            self.calls += 1
        self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        with self._lock:
            futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)
