"""spasm: persona-driven Client/Responder dialogue simulation into research-grade datasets.

The public names load on first use (PEP 562), so ``import spasm.history`` loads a handful of
modules, not the engine, the LLM layer or the run format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spasm.lazy import lazy_exports

if TYPE_CHECKING:
    from spasm.config import RunConfig, load_config, parse_config
    from spasm.dataset import Run, open_run
    from spasm.engine import Engine, RunSummary
    from spasm.errors import ConfigError, RunError, SpasmError, UserError
    from spasm.history import History, Utterance
    from spasm.projection import Viewer, get_projection, project, register_projection
    from spasm.tools import tool

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
    "tool": "spasm.tools",
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
    "tool",
]


__getattr__, __dir__ = lazy_exports('spasm', globals(), _HOMES)
