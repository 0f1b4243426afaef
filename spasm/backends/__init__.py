"""Model backends: the interface, the OpenAI-compatible client, the embedded model."""

from __future__ import annotations

from spasm.backends.base import Backend, ChatRequest, Completion
from spasm.config import BackendConfig

__all__ = ["Backend", "ChatRequest", "Completion", "make_backend"]


def make_backend(name: str, cfg: BackendConfig) -> Backend:
    """Build the backend a config entry describes."""
    if cfg.kind == "embedded":
        from spasm.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(name, cfg)
    from spasm.backends.openai_compat import OpenAIBackend

    return OpenAIBackend(name, cfg)
