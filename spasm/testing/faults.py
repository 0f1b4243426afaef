"""The test server's fault plan: which faults it injects, at what rates, drawn from a seeded
RNG (see :class:`~spasm.testing.server.TestServer`)."""

from __future__ import annotations

from typing import Literal

import pydantic

#: Keys of :attr:`TestServer.stats` besides ``requests``, in the order faults are drawn.
OUTCOMES: tuple[str, ...] = (
    "ok",
    "429",
    "500",
    "drop",
    "hang",
    "malformed",
    "empty",
    "bad_request",
    "trickle",
)

# Bodies of a 200 "malformed" answer (FaultPlan.malformed_body), with their content type: JSON
# cut off mid-object, an HTML page (a proxy's error page), JSON that is no chat completion.
_MALFORMED_BODIES: dict[str, tuple[bytes, str]] = {
    "truncated": (
        b'{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{"ind',
        "application/json",
    ),
    "html": (
        b"<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>",
        "text/html; charset=utf-8",
    ),
    "no_choices": (b'{"id": "chatcmpl-malformed", "object": "chat.completion"}', "application/json"),
}

#: The structured-output formats ``reject_formats`` may name.
FORMATS: tuple[str, ...] = ("json_schema", "json_object", "schema_field")


_Rate = pydantic.Field(default=0.0, ge=0.0, le=1.0)


class FaultPlan(pydantic.BaseModel, extra="forbid"):
    """What the server does to each request: a rate limit if set, latency, then at most one
    fault.

    For every ``POST`` to a known endpoint one number is drawn from ``random.Random(seed)``
    (under a lock) and compared against the cumulative rates in this fixed order: 429, 500,
    drop, hang, malformed, empty, trickle; otherwise the request succeeds. A run whose requests
    arrive in the same order therefore sees the same faults. Rates must sum to at most 1.
    """

    latency_s: float = pydantic.Field(default=0.0, ge=0.0)
    """Seconds to sleep before answering each request (faults included)."""
    rate_429: float = _Rate
    """Share of requests answered ``429 Too Many Requests``."""
    retry_after_s: float | None = pydantic.Field(default=0.05, ge=0.0)
    """Sent with 429s as ``Retry-After`` (seconds) and ``retry-after-ms``; ``None``: neither."""
    rate_500: float = _Rate
    """Share of requests answered ``500 Internal Server Error``."""
    rate_drop: float = _Rate
    """Share of requests whose connection is closed without any response."""
    rate_hang: float = _Rate
    """Share of requests that wait ``hang_s`` seconds, then close without a response."""
    hang_s: float = pydantic.Field(default=30.0, ge=0.0)
    """How long a hanging request waits before its connection is closed."""
    rate_malformed: float = _Rate
    """Share of requests answered 200 with a body that is not a chat completion."""
    malformed_body: Literal["truncated", "html", "no_choices"] = "truncated"
    """What a malformed answer is: JSON cut off mid-object, an HTML page (``text/html``), or
    JSON without ``choices``."""
    rate_empty: float = _Rate
    """Share of chat completions answered with content ``""``."""
    rate_trickle: float = _Rate
    """Share of requests answered correctly but slowly: the headers at once, then the body one
    byte every ``trickle_s`` seconds (each read is quick, the whole answer is not)."""
    trickle_s: float = pydantic.Field(default=0.5, ge=0.0)
    """Seconds between the bytes of a trickled answer."""
    seed: int = 0
    """Seed of the fault RNG; :meth:`TestServer.set_plan` reseeds it."""
    limit_rps: float | None = pydantic.Field(default=None, gt=0.0)
    """A request-rate limit, as a provider keeps per key: requests per second accepted, the
    rest refused with 429, ``Retry-After`` and ``retry-after-ms`` (stats ``limited``; see
    :mod:`spasm.testing.ratelimit`)."""
    limit_tps: float | None = pydantic.Field(default=None, gt=0.0)
    """A token-rate limit: tokens per second accepted, each request charged its prompt tokens
    plus its ``max_tokens`` on arrival."""
    limit_burst_s: float = pydantic.Field(default=1.0, gt=0.0)
    """The limits' buckets hold this many seconds of their rate (the burst a fresh key takes)."""
    limit_headers: bool = True
    """With a limit, send ``x-ratelimit-limit|remaining|reset-requests|tokens`` on every answer."""

    @pydantic.model_validator(mode="after")
    def _rates_sum_to_at_most_one(self) -> FaultPlan:
        total = sum(rate for _, rate in self.fault_rates())
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {total:g}; lower them so they sum to at most 1")
        return self

    def fault_rates(self) -> list[tuple[str, float]]:
        """The (outcome, rate) pairs in the order they are drawn."""
        return [
            ("429", self.rate_429),
            ("500", self.rate_500),
            ("drop", self.rate_drop),
            ("hang", self.rate_hang),
            ("malformed", self.rate_malformed),
            ("empty", self.rate_empty),
            ("trickle", self.rate_trickle),
        ]

    def pick(self, u: float) -> str:
        """Map a uniform draw ``u`` in [0, 1) to an outcome name (``"ok"`` when no fault)."""
        edge = 0.0
        for outcome, rate in self.fault_rates():
            edge += rate
            if u < edge:
                return outcome
        return "ok"


