"""Test support for driving a ``Scheduler`` by hand: what a step does with each chunk it planned."""
from __future__ import annotations

import random

from opforge.serve.scheduler import Chunk, Scheduler, Sequence


def complete(sched: Scheduler, chunk: Chunk, rng: random.Random, live: list[Sequence]) -> bool:
    """Mark ``chunk`` computed; a chunk that samples gets a random token, and its sequence, once it
    has its ``max_tokens``, leaves the scheduler and ``live``. Returns whether it finished."""
    sched.computed(chunk)
    if not chunk.samples:
        return False
    chunk.seq.tokens.append(rng.randrange(50))
    if chunk.seq.generated < chunk.seq.params.max_tokens:
        return False
    sched.remove(chunk.seq)
    live.remove(chunk.seq)
    return True
