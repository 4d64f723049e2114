"""Block tables kept on the device by slot: after any sequence of growth, new and dropped tables,
each step's gathered tables equal the host's lists (on their used width) and padding reads scratch."""
import random

import pytest
import torch

from opforge.serve.block_tables import SlotTables
from opforge.serve.kv_cache import SCRATCH_BLOCK


def _step(t: SlotTables, tables: list[list[int]]) -> torch.Tensor:
    slots, index, values = t.update(tables)
    assert len(set(slots)) == len(slots)                  # one slot per table
    t.apply(torch.tensor(index, dtype=torch.long), torch.tensor(values, dtype=torch.int32))
    return t.tables[torch.tensor(slots + [t.padding], dtype=torch.long)]


def test_random_steps_gather_the_host_tables():
    rng = random.Random(7)
    t = SlotTables(slots=6, width=8, device=torch.device("cpu"))
    live: list[list[int]] = []
    sent = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.2 and len(live) < 6:
            live.append([rng.randrange(1, 100) for _ in range(rng.randint(1, 3))])
        elif op < 0.35 and live:
            live.pop(rng.randrange(len(live)))            # finished or preempted: a new list if it comes back
        else:
            for row in live:
                if len(row) < 8 and rng.random() < 0.3:
                    row.append(rng.randrange(1, 100))
        rng.shuffle(live)
        before = t._written[:]
        got = _step(t, live)
        for row, g in zip(live, got):
            assert g[:len(row)].tolist() == row
        assert got[-1].tolist() == [SCRATCH_BLOCK] * 8
        sent += sum(t._written) - sum(before)
    # growth sends only new entries: far fewer than the whole tables every step
    assert sent < 300 * 6 * 8 / 4


def test_an_unchanged_step_sends_nothing_and_a_grown_row_one_entry():
    t = SlotTables(slots=2, width=4, device=torch.device("cpu"))
    a, b = [5, 6], [9]
    _step(t, [a, b])
    assert t.update([b, a])[1:] == ([], [])
    a.append(7)
    slots, index, values = t.update([a, b])
    assert values == [7] and index == [slots[0] * 4 + 2]


def test_too_many_or_too_wide_tables_are_refused():
    t = SlotTables(slots=2, width=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="slots"):
        t.update([[1], [2], [3]])
    with pytest.raises(ValueError, match="wider"):
        SlotTables(slots=2, width=2, device=torch.device("cpu")).update([[1, 2, 3]])
