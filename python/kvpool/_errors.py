"""kvpool's exception classes, for the pure-Python parts of the package.

The real classes live in the compiled extension ``kvpool._core`` so that the Rust pool and the
Python reference raise the very same types. When the extension has not been built (a source
checkout before ``maturin develop``), identical stand-ins are defined here, with the same names
and bases as in ``_core.pyi``, so that ``kvpool.reference`` still works on its own.

Only a missing ``kvpool._core`` triggers the stand-ins: if the extension imports but lacks one of
the names, the ``ImportError`` propagates rather than silently mixing two exception trees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import kvpool._core as _core_module  # noqa: F401  (probe: is the extension built?)
except ModuleNotFoundError as exc:  # only the missing extension itself, not a broken one
    if exc.name not in ("kvpool._core", "kvpool"):
        raise
    HAVE_CORE = False
else:
    HAVE_CORE = True

if TYPE_CHECKING or HAVE_CORE:
    from kvpool._core import (
        BlockStateError,
        CachingDisabledError,
        DoubleFreeError,
        DtypeError,
        HashWidthError,
        InvalidArgumentError,
        InvalidBlockIdError,
        InvariantError,
        KVPoolError,
        NoFreeBlocksError,
        DuplicateRequestError,
        OutOfMemoryError,
        PinBudgetError,
        TransportError,
        UnknownRequestError,
    )
else:

    class KVPoolError(Exception):
        """Base class of every error kvpool raises."""

    class NoFreeBlocksError(KVPoolError, ValueError):
        """Fewer free blocks than requested; nothing was allocated."""

    class InvalidBlockIdError(KVPoolError, ValueError):
        """A block id is negative, out of range, or the null block where it is not allowed."""

    class DoubleFreeError(KVPoolError, ValueError):
        """A block would be freed while its reference count is already 0."""

    class BlockStateError(KVPoolError, ValueError):
        """A block is in the wrong state for the operation (caching a free or already cached block)."""

    class HashWidthError(KVPoolError, ValueError):
        """A block hash is empty, longer than 32 bytes, or of another width than the pool's."""

    class DtypeError(KVPoolError, TypeError):
        """An argument has the wrong type or numpy dtype (block ids must be integers)."""

    class InvalidArgumentError(KVPoolError, ValueError):
        """An argument is out of its valid range or inconsistent with another one."""

    class CachingDisabledError(KVPoolError, RuntimeError):
        """A prefix-cache operation was called on a pool built with ``enable_caching=False``."""

    class InvariantError(KVPoolError, AssertionError):
        """``check_invariants`` found the pool's structure inconsistent (a bug in kvpool)."""

    class UnknownRequestError(KVPoolError, KeyError):
        """A request id that the manager does not track."""

    class DuplicateRequestError(KVPoolError, ValueError):
        """A request id that the manager already tracks."""

    class OutOfMemoryError(KVPoolError, MemoryError):
        """Memory for a pool, a manager or a batch could not be allocated; nothing was changed."""

    class PinBudgetError(KVPoolError, ValueError):
        """Pinning would exceed the pool's budget of pinned blocks (max_pinned_blocks); nothing was pinned."""

    class TransportError(KVPoolError, RuntimeError):
        """A batch could not be handed to ZeroMQ: the socket is closed, its context terminated, or the libzmq pyzmq uses cannot be reached from kvpool."""

    for _cls in (
        KVPoolError,
        NoFreeBlocksError,
        InvalidBlockIdError,
        DoubleFreeError,
        BlockStateError,
        HashWidthError,
        DtypeError,
        InvalidArgumentError,
        CachingDisabledError,
        InvariantError,
        UnknownRequestError,
        DuplicateRequestError,
        OutOfMemoryError,
        PinBudgetError,
        TransportError,
    ):
        _cls.__module__ = "kvpool"
    del _cls

__all__ = [
    "HAVE_CORE",
    "BlockStateError",
    "CachingDisabledError",
    "DoubleFreeError",
    "DtypeError",
    "DuplicateRequestError",
    "HashWidthError",
    "InvalidArgumentError",
    "InvalidBlockIdError",
    "InvariantError",
    "KVPoolError",
    "NoFreeBlocksError",
    "OutOfMemoryError",
    "PinBudgetError",
    "TransportError",
    "UnknownRequestError",
]
