"""Shared fixtures: the BlockPool implementations every test module runs against.

``kvpool.reference.BlockPool`` (plain Python) always runs. ``kvpool.BlockPool`` (the Rust
extension) runs when ``kvpool._core`` is built and is skipped otherwise; set
``KVPOOL_REQUIRE_CORE=1`` (CI does) to make a missing extension an error instead of a skip.

Before the extension is built, ``import kvpool`` fails (``kvpool/__init__.py`` re-exports from
``kvpool._core``). So that the reference can still be tested from a source checkout, this file
then registers a bare ``kvpool`` package module (its ``__init__`` not run) so that
``kvpool.reference``, ``kvpool.events`` and ``kvpool._errors`` import on their own.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest


def _import_kvpool() -> bool:
    """Import kvpool; return whether the Rust extension is available."""
    try:
        import kvpool  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "kvpool._core":
            raise
        spec = importlib.util.find_spec("kvpool")
        assert spec is not None and spec.submodule_search_locations is not None
        package = types.ModuleType("kvpool", "kvpool without its compiled extension (tests only)")
        package.__path__ = list(spec.submodule_search_locations)
        package.__file__ = spec.origin
        sys.modules["kvpool"] = package
        return False
    return True


HAVE_CORE = _import_kvpool()
REQUIRE_CORE = os.environ.get("KVPOOL_REQUIRE_CORE", "") not in ("", "0")

if REQUIRE_CORE and not HAVE_CORE:
    raise RuntimeError("KVPOOL_REQUIRE_CORE is set but kvpool._core is not built (run `maturin develop`)")

import kvpool.reference  # noqa: E402

ReferencePool = kvpool.reference.BlockPool
RustPool = getattr(sys.modules["kvpool"], "BlockPool", None) if HAVE_CORE else None

_SKIP_NO_CORE = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

POOL_IMPLS = [
    pytest.param(ReferencePool, id="reference"),
    pytest.param(RustPool, id="rust", marks=_SKIP_NO_CORE),
]


@pytest.fixture(params=POOL_IMPLS)
def Pool(request: pytest.FixtureRequest) -> type:
    """Each BlockPool implementation in turn (the Rust one only when built)."""
    return request.param


@pytest.fixture
def rust_pool_cls() -> type:
    """The Rust BlockPool; skips the test when the extension is not built."""
    if not HAVE_CORE:
        pytest.skip("kvpool._core is not built")
    return RustPool
