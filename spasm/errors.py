"""Exceptions raised by spasm.

The hierarchy, in one place::

    SpasmError                 base of everything spasm raises on purpose
    ├── ParticipantLeft        a person in a seat ended the dialogue (/end, Ctrl-D, Ctrl-C):
    │                          not a failure; the dialogue ends there and is saved
    ├── UserError              the input is wrong (config, schema, CLI flags, environment);
    │   │                      the CLI prints the message and exits with code 2
    │   ├── ConfigError        a run config or persona schema does not validate
    │   └── MissingKeyError    the environment variable named for an API key is unset, empty
    │                          or blank
    └── RunError               something went wrong while running (model, network, disk);
        │                      the CLI prints the message and exits with code 1
        ├── BackendError       a call to a model backend failed (``outcome``: its calls-table
        │   │                  outcome, ``status``: the HTTP status if there was one)
        │   ├── TransientBackendError   worth retrying: 5xx, 408, 409     (``server_error``)
        │   │   ├── RateLimitedError        429, maybe with a retry delay (``rate_limited``)
        │   │   ├── TimeoutBackendError     no answer within timeout_s    (``timeout``)
        │   │   ├── ConnectionBackendError  connection refused or dropped (``connection_error``)
        │   │   ├── MalformedResponseError  a body that is not an OpenAI chat completion
        │   │   │                           (not JSON, HTML, no choices)   (``malformed``)
        │   │   └── EmptyCompletionError    the model returned no text    (``empty``)
        │   └── FatalBackendError       not worth retrying: 4xx other than 408/409/429, a
        │                                request the local model refuses (``fatal``)
        ├── StructuredOutputRejectedError  the server refuses the structured-output format of
        │                                  the backend's mode; ends the run (``format_rejected``)
        ├── BudgetExceededError         the run reached its --max-cost / --max-tokens cap
        └── FormatError                 a row or table does not match the run format

Every message says what went wrong and, where we can tell, how to fix it.

A full disk is none of these: it is the environment. It stays an ``OSError`` with
``errno.ENOSPC`` (the request cache turns SQLite's "database or disk is full" into one), which
:func:`disk_full` recognises: a dialogue that meets it is not quarantined, the run stops with
everything committed so far kept, and the CLI says to free space and rerun.
"""

from __future__ import annotations

import errno
from typing import ClassVar


class SpasmError(Exception):
    """Base class for every error spasm raises on purpose."""


class UserError(SpasmError):
    """The user's input is wrong; the message says how to fix it (CLI exit code 2)."""


class ConfigError(UserError):
    """A config file, persona schema or option does not validate."""


class MissingKeyError(UserError):
    """The environment variable that should hold an API key is unset, empty or blank, or holds
    something that cannot be a key (a line break inside it, a non-ASCII character).

    ``problem`` is how it is wrong: ``"not set"``, ``"empty"``, ``"blank"`` (whitespace only) or
    a phrase that reads after "which is" (:mod:`spasm.backends.keys`). The value is never quoted.
    """

    def __init__(self, env_var: str, backend: str, problem: str = "not set") -> None:
        self.env_var = env_var
        self.backend = backend
        self.problem = problem
        what = {
            "not set": "which is not set",
            "empty": "which is empty",
            "blank": "which holds only whitespace",
        }.get(problem, f"which is {problem}")
        super().__init__(
            f"Backend {backend!r} needs an API key in the environment variable {env_var}, {what}. "
            f"Put the key in it (export {env_var}=...) or name another variable with "
            "api_key_env in the config (or --api-key-env on the command line)."
        )


class ParticipantLeft(SpasmError):
    """A person in a seat (a ``kind: human`` backend) ended the dialogue: typed ``/end``,
    closed the input (Ctrl-D) or interrupted it (Ctrl-C). Not a failure: the dialogue stops
    there and keeps what was said, with ``reason`` as its termination reason."""

    def __init__(self, detail: str, reason: str = "ended_by_person") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class RunError(SpasmError):
    """Something failed while running."""


class BackendError(RunError):
    """A call to a model backend failed.

    ``status`` is the HTTP status when the server answered; ``detail`` the server's own error
    message (or the local cause), without spasm's wording around it.
    """

    #: The ``calls.outcome`` of an attempt that failed this way.
    outcome: ClassVar[str] = "error"

    def __init__(self, message: str, *, status: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail if detail is not None else message


class TransientBackendError(BackendError):
    """A failure worth retrying (5xx, 408, 409; the subclasses name the other kinds)."""

    outcome: ClassVar[str] = "server_error"


class RateLimitedError(TransientBackendError):
    """HTTP 429; ``retry_after`` is the server's requested delay in seconds, if it gave one."""

    outcome: ClassVar[str] = "rate_limited"

    def __init__(
        self, message: str, *, retry_after: float | None = None, detail: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, status=429, detail=detail)
        self.retry_after = retry_after
        #: The answer's rate headers (``x-ratelimit-*``, ``Retry-After``; read by spasm.limits).
        self.headers = headers or {}


class TimeoutBackendError(TransientBackendError):
    """No response within the backend's ``timeout_s``."""

    outcome: ClassVar[str] = "timeout"


class ConnectionBackendError(TransientBackendError):
    """The connection could not be made or was dropped before a response."""

    outcome: ClassVar[str] = "connection_error"


class MalformedResponseError(TransientBackendError):
    """The response body is not an OpenAI chat completion (not JSON, HTML, no choices)."""

    outcome: ClassVar[str] = "malformed"


class FatalBackendError(BackendError):
    """A failure that retrying will not fix."""

    outcome: ClassVar[str] = "fatal"


class EmptyCompletionError(TransientBackendError):
    """The model returned an empty completion."""

    outcome: ClassVar[str] = "empty"


class StructuredOutputRejectedError(RunError):
    """The server refuses structured requests in the backend's structured-output mode.

    Not a :class:`BackendError`: no layer may fall back on it; it ends the run at once. It
    names the backend, the mode, the server's status and message, and what to change.
    """

    outcome: ClassVar[str] = "format_rejected"

    def __init__(self, backend: str, mode: str, status: int | None, server_message: str) -> None:
        self.backend = backend
        self.mode = mode
        self.status = status
        self.server_message = server_message
        others = [m for m in ("json_schema", "json_object", "text") if m != mode]
        super().__init__(
            f"Backend {backend!r} rejects structured output in mode {mode!r}: the server answered "
            f"{status if status is not None else 'an error'}: {_clip(server_message)}. "
            f"Set structured_output in this backend's config to 'auto' (spasm then finds a mode "
            f"the server takes) or to one of {others}."
        )


def _clip(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters (servers send tracebacks in messages)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class BudgetExceededError(RunError):
    """The run reached its cost or token cap."""


class FormatError(RunError):
    """A row or a table does not match the run format (a misspelled or undeclared field, a
    wrong type, a table spasm does not know). Raised by :mod:`spasm.dataset`."""


class EndpointRefusedError(RunError):
    """A backend refuses every call with the same client error (404: a wrong path or model;
    400: a parameter it does not take) before it ever answered one: the run stops at once
    instead of quarantining every dialogue."""

    outcome: ClassVar[str] = "fatal"

    def __init__(self, backend: str, status: int | None, message: str, count: int) -> None:
        self.backend = backend
        self.status = status
        hint = (" Check base_url and the model name." if status == 404 else
                " Check the backend's settings against what the server accepts.")
        super().__init__(
            f"Backend {backend!r} refused the first {count} calls with {status}: {_clip(message)}."
            f"{hint} Nothing more was sent; rerun the same command once it is fixed."
        )


#: errno values of a full disk (or a full quota).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is the disk being full: an ``OSError`` with ENOSPC or EDQUOT (pyarrow's
    write errors carry the errno in their text only)."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in DISK_FULL_ERRNOS:
        return True
    return exc.errno is None and "No space left on device" in str(exc)
