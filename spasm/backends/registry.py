"""Backends registered by kind, like projections and embedders.

A backend class registers itself with ``@register_backend("kind")``; a config entry's ``kind``
picks it. The names live in :data:`spasm.registry.BACKENDS` (so the config checks a kind
without importing any backend); the built-in kinds (``openai``, ``embedded``) are imported on
first use, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from spasm.backends.base import Backend
from spasm.errors import ConfigError
from spasm.registry import BACKENDS

if TYPE_CHECKING:
    from spasm.config import BackendConfig

__all__ = ["backend_kinds", "make_backend", "register_backend"]

#: A backend class, or any callable that builds one from its name and config.
Factory = Callable[[str, "BackendConfig"], Backend]
F = TypeVar("F", bound=Factory)



def register_backend(kind: str, *, replace: bool = False) -> Callable[[F], F]:
    """Register a backend class (or factory) under ``kind``; a later registration replaces it
    (a plugin replaces a built-in kind only with ``replace=True``: :mod:`spasm.registry`)."""

    def decorate(factory: F) -> F:
        BACKENDS.register(kind, replace=replace)(factory)
        return factory

    return decorate


def backend_kinds() -> list[str]:
    """Every registered kind, sorted."""
    return BACKENDS.names()


def make_backend(name: str, cfg: BackendConfig) -> Backend:
    """Build the backend a config entry describes; an unknown kind is a ConfigError."""
    factory = cast("Factory | None", BACKENDS.get(cfg.kind))
    if factory is None:
        raise ConfigError(
            f"Backend {name!r} has kind {cfg.kind!r}, which no backend is registered for; "
            f"known kinds: {BACKENDS.names()}."
        )
    return factory(name, cfg)
