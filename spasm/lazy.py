"""Public names a package loads on first use (PEP 562), so importing one module of the package
does not load its whole surface (a leaf: imports nothing of spasm)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name in ``homes`` is imported
    from its module on first access and kept in ``namespace`` (the package's globals)."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return getattr_, dir_
