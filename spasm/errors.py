"""Exceptions raised by spasm.

The hierarchy, in one place::

    SpasmError                 base of everything spasm raises on purpose
    ├── UserError              the input is wrong (config, schema, CLI flags, environment);
    │   │                      the CLI prints the message and exits with code 2
    │   ├── ConfigError        a run config or persona schema does not validate
    │   └── MissingKeyError    the environment variable named for an API key is unset
    └── RunError               something went wrong while running (model, network, disk)
        ├── BackendError       a call to a model backend failed
        │   ├── TransientBackendError   worth retrying: 429, 5xx, timeouts, dropped connections
        │   │   └── RateLimitedError    429, optionally with a server-given retry delay
        │   ├── FatalBackendError       not worth retrying: 4xx other than 429, refused connections
        │   │                            at start-up, malformed replies after all re-asks
        │   └── EmptyCompletionError    the model returned no text
        └── BudgetExceededError         the run reached its --max-cost / --max-tokens cap

Every message says what went wrong and, where we can tell, how to fix it.
"""

from __future__ import annotations


class SpasmError(Exception):
    """Base class for every error spasm raises on purpose."""


class UserError(SpasmError):
    """The user's input is wrong; the message says how to fix it (CLI exit code 2)."""


class ConfigError(UserError):
    """A config file, persona schema or option does not validate."""


class MissingKeyError(UserError):
    """The environment variable that should hold an API key is not set."""

    def __init__(self, env_var: str, backend: str) -> None:
        self.env_var = env_var
        self.backend = backend
        super().__init__(
            f"Backend {backend!r} needs an API key in the environment variable {env_var}, "
            f"which is not set. Set it (export {env_var}=...) or name another variable with "
            "api_key_env in the config (or --api-key-env on the command line)."
        )


class RunError(SpasmError):
    """Something failed while running."""


class BackendError(RunError):
    """A call to a model backend failed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TransientBackendError(BackendError):
    """A failure worth retrying (429, 5xx, timeout, dropped connection, malformed body)."""


class RateLimitedError(TransientBackendError):
    """HTTP 429; ``retry_after`` is the server's requested delay in seconds, if it gave one."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message, status=429)
        self.retry_after = retry_after


class FatalBackendError(BackendError):
    """A failure that retrying will not fix."""


class EmptyCompletionError(TransientBackendError):
    """The model returned an empty completion."""


class BudgetExceededError(RunError):
    """The run reached its cost or token cap."""
