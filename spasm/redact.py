"""Credentials out of URLs: the one redaction function for what spasm stores or prints.

A ``base_url`` may carry a secret (``http://user:password@host/v1``, ``...?api_key=...``).
Whatever spasm writes (``config.json``, the call log, ``metrics.json``, cache folder names) or
prints (errors, warnings) goes through :func:`redact_url` first. A leaf module: it imports
nothing of spasm, so every layer may use it.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_url", "terminal_safe"]

#: What stands in for a removed credential.
REDACTED = "***"

# ``scheme://userinfo@``: the user name may be a token itself, so all of it goes (up to the
# last ``@`` before the path: a password may hold an unescaped ``@``).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]+@")
# Query parameters that usually carry a credential (``?api_key=...&token=...``).
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&](?:api[_-]?key|key|token|access[_-]?token|auth|password|passwd|secret|sig|"
    r"signature)=)[^&#\s]+",
    re.IGNORECASE,
)


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every credential in a URL replaced by
    :data:`REDACTED`: the user-info part (``http://***@host``) and credential-like query
    parameters (``?api_key=***``). Text without one is returned unchanged."""
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    if "=" in text:
        text = _SECRET_PARAM.sub(lambda m: f"{m['name']}{REDACTED}", text)
    return text


def terminal_safe(text: str, keep: str = "") -> str:
    """``text`` as a terminal may be shown it: control characters (a NUL, an escape sequence
    that would recolour or clear the screen, a carriage return) written as ``\\x00``-style
    escapes, except those in ``keep`` (``"\\n\\t"`` for a multi-line text). For what is
    printed, never for what is stored."""
    return "".join(c if c.isprintable() or c == " " or c in keep else repr(c)[1:-1] for c in text)
