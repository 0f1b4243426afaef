"""The one place spasm reads an API key from the environment.

Configs name the *variable* (``api_key_env``), never the key; :func:`resolve_api_key` reads it
when a client is built (never at import time) and the key lives only inside that client.
"""

from __future__ import annotations

import os

from spasm.errors import MissingKeyError

__all__ = ["NO_KEY", "resolve_api_key"]

#: What is sent when no variable is named: local servers (vLLM, llama.cpp, Ollama) accept any
#: key, but the openai SDK insists on one.
NO_KEY = "not-needed"


def resolve_api_key(api_key_env: str | None, who: str) -> str:
    """The API key in the environment variable named ``api_key_env``, for ``who`` (a backend
    name, used in the message); :data:`NO_KEY` when no variable is named.

    Raises :class:`~spasm.errors.MissingKeyError` when the variable is not set, is empty, or
    holds only whitespace. Surrounding whitespace (a newline from ``$(cat key.txt)``) is dropped.
    """
    if api_key_env is None:
        return NO_KEY
    value = os.environ.get(api_key_env)
    if value is None:
        raise MissingKeyError(api_key_env, who, "not set")
    if value == "":
        raise MissingKeyError(api_key_env, who, "empty")
    key = value.strip()
    if not key:
        raise MissingKeyError(api_key_env, who, "blank")
    return key
