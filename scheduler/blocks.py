"""The block-manager interface the planner acquires memory through, a plain implementation of it
(used by the simulator), and the bounded host swap pool."""

from __future__ import annotations

from typing import Protocol


class BlockError(RuntimeError):
    """An allocation or free that the accounting does not allow."""


class BlockManager(Protocol):
    def num_free(self) -> int: ...

    def can_allocate(self, num_blocks: int) -> bool: ...

    def allocate(self, request_id: str, num_blocks: int) -> None: ...

    def free(self, request_id: str, num_blocks: int | None = None) -> int:
        """Free `num_blocks` of the request's blocks (all when None); returns how many."""


class CountingBlockManager:
    """Device KV blocks as counts per request: all the planner and the simulator need."""

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise BlockError(f"need a positive number of blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = num_blocks
        self.held: dict[str, int] = {}

    def num_free(self) -> int:
        return self._free

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self._free

    def allocate(self, request_id: str, num_blocks: int) -> None:
        if num_blocks < 0 or num_blocks > self._free:
            raise BlockError(f"cannot allocate {num_blocks} blocks, {self._free} free")
        self._free -= num_blocks
        self.held[request_id] = self.held.get(request_id, 0) + num_blocks

    def free(self, request_id: str, num_blocks: int | None = None) -> int:
        held = self.held.get(request_id, 0)
        count = held if num_blocks is None else num_blocks
        if count < 0 or count > held:
            raise BlockError(f"{request_id} holds {held} blocks, cannot free {count}")
        self._free += count
        if count == held:
            self.held.pop(request_id, None)
        else:
            self.held[request_id] = held - count
        return count


class SwapPool(CountingBlockManager):
    """Host memory for swapped-out KV blocks: bounded (the paper assumed it was unlimited)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = max(0, num_blocks)
        self._free = self.num_blocks
        self.held = {}
