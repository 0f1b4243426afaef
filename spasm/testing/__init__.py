"""Test helpers that ship with spasm: an OpenAI-compatible server with fault injection.

``FaultPlan`` and ``TestServer`` live in :mod:`spasm.testing.server`; they are loaded on first
use so that ``python -m spasm.testing.server`` does not import its own module twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spasm.testing.server import FaultPlan, TestServer

__all__ = ["FaultPlan", "TestServer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spasm.testing import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
