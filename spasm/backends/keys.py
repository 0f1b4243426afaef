"""The one place spasm reads an API key from the environment.

Configs name the *variable* (``api_key_env``), never the key; :func:`resolve_api_key` reads it
when a client is built (never at import time) and the key lives only inside that client.
"""

from __future__ import annotations

import os

from spasm.errors import MissingKeyError

__all__ = ["NO_KEY", "resolve_api_key"]

#: How a set key can be unusable (:attr:`~spasm.errors.MissingKeyError.problem`; each reads
#: after "which is").
CONTROL = "not a usable key: it holds a line break, a tab or another control character"
NON_ASCII = "not a usable key: it holds a non-ASCII character (HTTP headers carry ASCII only)"

#: What is sent when no variable is named: local servers (vLLM, llama.cpp, Ollama) accept any
#: key, but the openai SDK insists on one.
NO_KEY = "not-needed"


def resolve_api_key(api_key_env: str | None, who: str) -> str:
    """The API key in the environment variable named ``api_key_env``, for ``who`` (a backend
    name, used in the message); :data:`NO_KEY` when no variable is named.

    Raises :class:`~spasm.errors.MissingKeyError` when the variable is not set, is empty, holds
    only whitespace, or holds a control character (a line break inside the key) or a non-ASCII
    character; the message names the variable, never the value. Surrounding whitespace (a
    newline from ``$(cat key.txt)``) is dropped.
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
    # A key goes into an HTTP header: a line break or a non-ASCII character would make the
    # request fail inside the HTTP library, with the header (the key) in its message, blamed
    # on the server. Refuse it here, naming the variable and never the value.
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        raise MissingKeyError(api_key_env, who, CONTROL)
    if not key.isascii():
        raise MissingKeyError(api_key_env, who, NON_ASCII)
    return key
