"""The paged KV cache's bookkeeping: a pool of fixed-size blocks, one block table per sequence,
reference counts, and prefix caching.

A block holds ``block_size`` consecutive positions of one sequence (the pages themselves are
tensors the engine owns; this module only hands out their indices). Block 0 is never handed out:
it is the scratch block that padding rows of a captured decode step write into.

Prefix caching: once a block is full, it is named by a digest of its tokens and of the digest of
the block before it, so equal names mean equal token prefixes. A new sequence whose prompt starts
with named blocks takes them (one more reference each) and skips computing those positions. When
the last reference goes, a named block is not wiped: it waits in a least-recently-used list and
is taken back from there either by a sequence that needs its prefix or, oldest first, when a
fresh block is needed and the free list is empty.

Example:
    >>> cache = BlockManager(num_blocks=8, block_size=4)
    >>> cache.allocate("a", list(range(10)))        # no prefix cached yet: 0 positions skipped
    0
    >>> cache.grow("a", 10)
    True
    >>> cache.table("a")
    [1, 2, 3]
    >>> cache.commit("a", list(range(10)), 10)      # blocks 1 and 2 are full: they get names
    >>> cache.free("a")
    >>> cache.allocate("b", list(range(9)))         # the first 8 positions are cached
    8
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Optional, Sequence, Union

SCRATCH_BLOCK = 0
"""The block padding rows write into; never part of a sequence's table."""


def block_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The name of a full block: a digest of its parent's name and its tokens.

    Example:
        >>> block_digest(b"", [1, 2]) == block_digest(b"", [1, 2]) != block_digest(b"x", [1, 2])
        True
    """
    return _digest(parent, array("q", tokens).tobytes())


def _digest(parent: bytes, data: Union[bytes, memoryview]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(data)
    return h.digest()


@dataclass
class _Table:
    blocks: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)   # names of blocks[:len(digests)] (all full)


class BlockManager:
    """Blocks of the paged cache: allocation, sharing by reference count, prefix caching.

    Args:
        num_blocks: blocks in the pool, the scratch block included (so ``num_blocks - 1`` usable).
        block_size: positions per block.
        enable_prefix_caching: name full blocks and reuse them across sequences.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (one is the scratch block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))        # pop() hands out 1, 2, 3, ...
        self._cached: OrderedDict[int, bytes] = OrderedDict()   # unreferenced named blocks, oldest first
        self._by_digest: dict[bytes, int] = {}
        self._digest_of: dict[int, bytes] = {}
        self._tables: dict[Hashable, _Table] = {}
        self.queries = 0     # prompt positions looked up in the prefix cache (full blocks only)
        self.hits = 0        # of which found

    # ---- counts --------------------------------------------------------------------------------
    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now: free ones plus unreferenced cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached(self) -> int:
        """Unreferenced blocks kept for their prefix."""
        return len(self._cached)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.usable_blocks - self.num_free

    def blocks_for(self, positions: int) -> int:
        """Blocks needed to hold ``positions`` positions."""
        return -(-positions // self.block_size)

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._tables

    def table(self, seq: Hashable) -> list[int]:
        """The blocks of ``seq``, in position order."""
        return self._tables[seq].blocks

    def extend_digests(self, tokens: Sequence[int], digests: list[bytes], blocks: int) -> list[bytes]:
        """Extend ``digests`` (the names of the first blocks of ``tokens``, computed earlier: a
        sequence's tokens are only appended to) in place to the first ``blocks`` full blocks'
        names; returns it. Each name is computed once per sequence.

        Example:
            >>> cache = BlockManager(8, 2)
            >>> names = cache.extend_digests([1, 2, 3, 4, 5], [], 1)
            >>> cache.extend_digests([1, 2, 3, 4, 5], names, 2) == [block_digest(b"", [1, 2]), block_digest(names[0], [3, 4])]
            True
        """
        done, bs = len(digests), self.block_size
        if blocks > done:
            data = memoryview(array("q", tokens[done * bs:blocks * bs]).tobytes())
            parent, width = (digests[-1] if digests else b""), bs * 8
            for i in range(blocks - done):
                parent = _digest(parent, data[i * width:(i + 1) * width])
                digests.append(parent)
        return digests

    def named(self, seq: Hashable) -> int:
        """How many of ``seq``'s blocks are named (full, computed and committed)."""
        return len(self._tables[seq].digests)

    # ---- sequences -----------------------------------------------------------------------------
    def allocate(self, seq: Hashable, tokens: Sequence[int], digests: Optional[list[bytes]] = None) -> int:
        """Start a table for ``seq`` holding the longest cached prefix of ``tokens`` that leaves at
        least one token to compute (its logits are needed); returns that prefix's length.

        Takes no fresh block: ``grow`` does, once the caller knows how far to compute.
        ``digests``: the sequence's block names known so far (see ``extend_digests``), extended.
        """
        if seq in self._tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        table = self._tables[seq] = _Table()
        if not self.enable_prefix_caching:
            return 0
        full = (len(tokens) - 1) // self.block_size
        self.queries += full * self.block_size
        names = self.extend_digests(tokens, [] if digests is None else digests, full)
        for digest in names[:full]:
            block = self._by_digest.get(digest)
            if block is None:
                break
            self._take(block)
            table.blocks.append(block)
            table.digests.append(digest)
        self.hits += len(table.blocks) * self.block_size
        return len(table.blocks) * self.block_size

    def can_grow(self, seq: Hashable, positions: int) -> bool:
        """Whether ``grow(seq, positions)`` would succeed."""
        return self.blocks_for(positions) - len(self._tables[seq].blocks) <= self.num_free

    def grow(self, seq: Hashable, positions: int) -> bool:
        """Make ``seq``'s table hold ``positions`` positions; False (and nothing taken) if the pool
        cannot."""
        table = self._tables[seq]
        need = self.blocks_for(positions) - len(table.blocks)
        if need > self.num_free:
            return False
        for _ in range(need):
            table.blocks.append(self._fresh())
        return True

    def commit(self, seq: Hashable, tokens: Sequence[int], computed: int,
               digests: Optional[list[bytes]] = None) -> None:
        """Name the blocks of ``seq`` that ``computed`` positions (holding ``tokens[:computed]``)
        filled, so later sequences can share them (``digests`` as in ``allocate``)."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[seq]
        full = computed // self.block_size
        if full <= len(table.digests):
            return
        names = self.extend_digests(tokens, list(table.digests) if digests is None else digests, full)
        for i in range(len(table.digests), full):
            digest = names[i]
            table.digests.append(digest)
            block = table.blocks[i]
            if digest not in self._by_digest and block not in self._digest_of:
                self._by_digest[digest] = block
                self._digest_of[block] = digest

    def free(self, seq: Hashable) -> None:
        """Drop ``seq``'s references; blocks no one references become free, or cached if named
        (the sequence's last blocks first out: they are the least likely prefix of another)."""
        table = self._tables.pop(seq)
        for block in reversed(table.blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                digest = self._digest_of.get(block)
                if digest is None:
                    self._free.append(block)
                else:
                    self._cached[block] = digest

    # ---- blocks --------------------------------------------------------------------------------
    def _take(self, block: int) -> None:
        if self.refs[block] == 0:
            del self._cached[block]
        self.refs[block] += 1

    def _fresh(self) -> int:
        if self._free:
            block = self._free.pop()
        else:                                        # evict the least recently used cached block
            block, digest = self._cached.popitem(last=False)
            del self._by_digest[digest], self._digest_of[block]
        self.refs[block] = 1
        return block

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (referenced blocks keep their contents, unnamed)."""
        self._free.extend(self._cached)
        self._cached.clear()
        self._by_digest.clear()
        self._digest_of.clear()

    def check(self, idle: Optional[bool] = None) -> None:
        """Assert the invariants: every usable block exactly one of free / cached / referenced;
        reference counts equal the tables' references; names consistent; when ``idle`` (no
        sequences), nothing referenced."""
        counted = [0] * self.num_blocks
        for table in self._tables.values():
            assert len(table.digests) <= len(table.blocks)
            for block in table.blocks:
                assert block != SCRATCH_BLOCK, "scratch block in a table"
                counted[block] += 1
        assert counted == self.refs, "reference counts differ from the tables' references"
        free, cached = set(self._free), set(self._cached)
        assert len(free) == len(self._free), "a block twice in the free list"
        assert SCRATCH_BLOCK not in free and SCRATCH_BLOCK not in cached
        assert not free & cached, "a block both free and cached"
        for block in range(1, self.num_blocks):
            states = (block in free) + (block in cached) + (self.refs[block] > 0)
            assert states == 1, f"block {block} is in {states} states (free, cached, referenced)"
        assert all(self._digest_of.get(b) == d for b, d in self._cached.items())
        assert all(self._by_digest[d] == b for b, d in self._digest_of.items())
        assert len(self._by_digest) == len(self._digest_of)
        assert not free & set(self._digest_of), "a free block still has a name"
        if idle or (idle is None and not self._tables):
            assert self.num_used == 0 and self.num_free == self.usable_blocks
