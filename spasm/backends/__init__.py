"""Model backends: the interface, the registry by kind, the OpenAI-compatible client, the
embedded model, and the one function that reads an API key."""

from __future__ import annotations

from spasm.backends.base import Backend, CallContext, ChatRequest, Completion
from spasm.backends.keys import resolve_api_key
from spasm.backends.registry import backend_kinds, make_backend, register_backend

__all__ = [
    "Backend",
    "CallContext",
    "ChatRequest",
    "Completion",
    "backend_kinds",
    "make_backend",
    "register_backend",
    "resolve_api_key",
]
