"""Backends registered by kind, like projections and embedders.

A backend class registers itself with ``@register_backend("kind")``; a config entry's ``kind``
picks it. The built-in kinds (``openai``, ``embedded``) are imported on first use, so importing
this module stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

from spasm.backends.base import Backend
from spasm.config import BackendConfig
from spasm.errors import ConfigError

__all__ = ["backend_kinds", "make_backend", "register_backend"]

#: A backend class, or any callable that builds one from its name and config.
Factory = Callable[[str, BackendConfig], Backend]
F = TypeVar("F", bound=Factory)

_REGISTRY: dict[str, Factory] = {}
_BUILTIN_MODULES = ("spasm.backends.openai_compat", "spasm.backends.embedded")


def register_backend(kind: str) -> Callable[[F], F]:
    """Register a backend class (or factory) under ``kind``; a later registration replaces it."""

    def decorate(factory: F) -> F:
        _REGISTRY[kind] = factory
        return factory

    return decorate


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def backend_kinds() -> list[str]:
    """Every registered kind, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def make_backend(name: str, cfg: BackendConfig) -> Backend:
    """Build the backend a config entry describes; an unknown kind is a ConfigError."""
    _load_builtins()
    factory = _REGISTRY.get(cfg.kind)
    if factory is None:
        raise ConfigError(
            f"Backend {name!r} has kind {cfg.kind!r}, which no backend is registered for; "
            f"known kinds: {sorted(_REGISTRY)}."
        )
    return factory(name, cfg)
