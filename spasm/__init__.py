"""spasm: persona-driven Client/Responder dialogue simulation into research-grade datasets."""

from __future__ import annotations

from spasm.config import RunConfig, load_config, parse_config
from spasm.dataset import Run, open_run
from spasm.engine import Engine, RunSummary
from spasm.errors import ConfigError, RunError, SpasmError, UserError
from spasm.history import History, Utterance
from spasm.projection import Viewer, get_projection, project, register_projection

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
