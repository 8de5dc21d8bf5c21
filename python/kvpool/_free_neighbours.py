"""A block view's free-queue neighbours (``KVCacheBlockView.next_free_block`` and
``prev_free_block``), read from its pool without importing vLLM.

vLLM's free queue is a linked list with two sentinel blocks at its ends; kvpool.vllm's
``FreeQueueView`` of a pool stands in for them (``fake_free_list_head``/``_tail``) and
registers itself here, so that the neighbours of a pool's first and last free blocks are
those ends. A view of a pool with no queue view (one made with ``KVCacheBlockView`` or
``FreeBlockWalk`` on a plain ``kvpool.BlockPool``) has ``None`` past the ends. Every answer
is O(1) from Rust (``free_block_ids_after``, ``free_block_id_before``; the last block,
behind the fake tail, is ``free_block_id_before(None)``) but the previous block under the
adaptive policy, which is O(its position among the cached blocks).
"""

from __future__ import annotations

import weakref
from typing import Any

import kvpool

#: Each pool's free-queue view, by ``id(pool)``: held weakly, so that a manager's pool is let
#: go with the manager. (A view holds its pool, so an id here cannot be a dead pool's.)
QUEUES: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def is_free(pool: kvpool.BlockPool, block_id: int) -> bool:
    """Whether the block is in the free queue (unreferenced, and not the null block)."""
    return pool.ref_count(block_id) == 0 and block_id != pool.null_block


def neighbour_of(pool: kvpool.BlockPool, block_id: int, step: int) -> Any:
    """Block ``block_id``'s next (``step`` 1) or previous (-1) free block as a view, the
    queue view's fake end past the last or first one (``None`` without a queue view), or
    ``None`` when the block is not free."""
    if not is_free(pool, block_id):
        return None
    queue = QUEUES.get(id(pool))
    if step > 0:
        after = pool.free_block_ids_after(block_id, 1)
        if len(after):
            return kvpool._core.KVCacheBlockView(pool, int(after[0]))
        return None if queue is None else queue.fake_free_list_tail
    before = pool.free_block_id_before(block_id)
    if before is not None:
        return kvpool._core.KVCacheBlockView(pool, before)
    return None if queue is None else queue.fake_free_list_head
