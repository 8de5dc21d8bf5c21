"""kvpool's semantics in plain Python, written for clarity, not speed.

The test oracle (property tests drive it and the Rust classes with the same
operations and compare every observable) and the benchmark baseline.
"""

from kvpool.reference.manager import KVCacheManager, StepResult
from kvpool.reference.pool import BlockPool
from kvpool.reference.hashing import BlockHasher
from kvpool.reference.tracker import ComputedBlocksTracker

__all__ = ["BlockPool", "KVCacheManager", "StepResult", "BlockHasher", "ComputedBlocksTracker"]
