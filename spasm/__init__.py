"""spasm: persona-driven Client/Responder dialogue simulation into research-grade datasets.

The public names load on first use (PEP 562), so ``import spasm.history`` loads a handful of
modules, not the engine, the LLM layer or the run format.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spasm.config import RunConfig, load_config, parse_config
    from spasm.dataset import Run, open_run
    from spasm.engine import Engine, RunSummary
    from spasm.errors import ConfigError, RunError, SpasmError, UserError
    from spasm.history import History, Utterance
    from spasm.projection import Viewer, get_projection, project, register_projection

#: Each public name and the module that defines it.
_HOMES = {
    "ConfigError": "spasm.errors",
    "Engine": "spasm.engine",
    "History": "spasm.history",
    "Run": "spasm.dataset",
    "RunConfig": "spasm.config",
    "RunError": "spasm.errors",
    "RunSummary": "spasm.engine",
    "SpasmError": "spasm.errors",
    "UserError": "spasm.errors",
    "Utterance": "spasm.history",
    "Viewer": "spasm.projection",
    "get_projection": "spasm.projection",
    "load_config": "spasm.config",
    "open_run": "spasm.dataset",
    "parse_config": "spasm.config",
    "project": "spasm.projection",
    "register_projection": "spasm.projection",
}

__all__ = [
    "ConfigError",
    "Engine",
    "History",
    "Run",
    "RunConfig",
    "RunError",
    "RunSummary",
    "SpasmError",
    "UserError",
    "Utterance",
    "Viewer",
    "get_projection",
    "load_config",
    "open_run",
    "parse_config",
    "project",
    "register_projection",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'spasm' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
