"""Block tables kept on the device between steps, updated by the entries that changed.

Each sequence gets a slot: a row of a device tensor holding its blocks. A step sends only the
blocks added since the slot was last written (a sequence gains one block every ``block_size``
decode steps) and, per row of the step, the slot it reads; the step's own table is then one
``index_select`` on the device. A slot belongs to one block list object (``BlockManager.table``):
a table is only ever appended to while it lives, so the entries written stay valid; a preempted
and readmitted sequence has a new list and gets a new slot. The last row is the padding slot:
all scratch blocks, for padding rows.

Example:
    >>> import torch
    >>> t = SlotTables(slots=2, width=4, device=torch.device("cpu"))
    >>> a, b = [3, 4], [7]
    >>> slots, index, values = t.update([a, b])
    >>> t.apply(torch.tensor(index), torch.tensor(values, dtype=torch.int32))
    >>> t.tables[torch.tensor(slots + [t.padding])].tolist()
    [[3, 4, 0, 0], [7, 0, 0, 0], [0, 0, 0, 0]]
    >>> a.append(5)
    >>> t.update([a, b])[1:]     # only the new block is sent
    ([2], [5])
"""
from __future__ import annotations

from typing import Sequence

import torch

from .kv_cache import SCRATCH_BLOCK


class SlotTables:
    """``slots`` block-table rows of ``width`` entries on ``device``, plus the padding row."""

    def __init__(self, slots: int, width: int, device: torch.device):
        self.width, self.padding = width, slots
        self.tables = torch.full((slots + 1, width), SCRATCH_BLOCK, dtype=torch.int32, device=device)
        self._owner: list[object] = [None] * slots      # the block list each slot holds
        self._written = [0] * slots                     # its entries already on the device
        self._slot_of: dict[int, int] = {}              # id(block list) -> slot
        self._free = list(range(slots - 1, -1, -1))

    def update(self, blocks: Sequence[list[int]]) -> tuple[list[int], list[int], list[int]]:
        """The slot of each block list and the flat entries (index into ``tables.view(-1)``, value)
        to write before a step reads them; records them as written (``apply`` must follow).
        Slots of lists absent from ``blocks`` are reused when no slot is free."""
        if len(blocks) > self.padding:
            raise ValueError(f"blocks: {len(blocks)} tables, more than the {self.padding} slots")
        slots, index, values = [], [], []
        present = None
        for row in blocks:
            slot = self._slot_of.get(id(row))
            if slot is None or self._owner[slot] is not row:
                if not self._free:                      # some slot's list is absent: reuse it
                    present = {id(r) for r in blocks} if present is None else present
                    self._release(present)
                slot = self._free.pop()
                self._owner[slot], self._written[slot], self._slot_of[id(row)] = row, 0, slot
            done, n = self._written[slot], len(row)
            if n > self.width:
                raise ValueError(f"blocks: a table of {n} blocks, wider than {self.width}")
            if n > done:
                base = slot * self.width
                index.extend(range(base + done, base + n))
                values.extend(row[done:n])
                self._written[slot] = n
            slots.append(slot)
        return slots, index, values

    def _release(self, keep: set[int]) -> None:
        for slot, owner in enumerate(self._owner):
            if owner is not None and id(owner) not in keep:
                del self._slot_of[id(owner)]
                self._owner[slot] = None
                self._free.append(slot)

    def apply(self, index: torch.Tensor, values: torch.Tensor) -> None:
        """Write the entries ``update`` returned (tensors on the device, or copied there)."""
        if index.numel():
            self.tables.view(-1).index_copy_(0, index, values)

    def stage(self, host: torch.Tensor, offset: int, capacity: int, index: list[int], values: list[int]) -> int:
        """Put ``update``'s k entries into ``host[offset:offset + 2k]`` (the indices, then the
        values), to travel in the step's one input copy; returns k. More than ``capacity`` entries
        (rare: many new tables at once) are written to the device now instead, and 0 is returned."""
        k = len(index)
        if k > capacity:
            dev = self.tables.device
            self.apply(torch.tensor(index, device=dev), torch.tensor(values, dtype=torch.int32, device=dev))
            return 0
        if k:
            host[offset:offset + 2 * k] = torch.tensor(index + values)
        return k

    def apply_staged(self, inputs: torch.Tensor, offset: int, k: int) -> None:
        """Write the k entries ``stage`` put at ``offset``, once ``inputs`` (on the device) holds them."""
        if k:
            self.apply(inputs[offset:offset + k], inputs[offset + k:offset + 2 * k].int())
