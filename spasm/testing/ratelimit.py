"""The test server's rate limits: a request bucket and a token bucket, as a provider keeps per
key (:attr:`FaultPlan.limit_rps`, :attr:`FaultPlan.limit_tps`).

Each bucket holds ``rate × limit_burst_s`` units and refills continuously at ``rate`` per
second. A request is charged when it arrives: one request, and its prompt tokens (the server's
own count) plus its ``max_tokens``, as OpenAI reserves them. A request either bucket cannot pay
is refused with a 429 that is not charged, whose ``Retry-After`` (whole seconds, rounded up) and
``retry-after-ms`` say when it would fit. Every answer, refused or not, carries the OpenAI
headers (unless ``limit_headers`` is off)::

    x-ratelimit-limit-requests: 40          x-ratelimit-limit-tokens: 6000
    x-ratelimit-remaining-requests: 12      x-ratelimit-remaining-tokens: 2210
    x-ratelimit-reset-requests: 700ms       x-ratelimit-reset-tokens: 631ms

(``reset``: the time until the bucket is full again, as a Go duration).
"""

from __future__ import annotations

import math
import threading
import time

__all__ = ["Limiter", "format_duration"]


def format_duration(seconds: float) -> str:
    """A duration the way OpenAI writes its reset headers: ``"12ms"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class _Bucket:
    def __init__(self, rate: float, burst_s: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * burst_s)
        self.level = self.capacity
        self.updated = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` fits (0: it fits now)."""
        amount = min(amount, self.capacity)
        return max(0.0, (amount - self.level) / self.rate)

    def headers(self, kind: str) -> dict[str, str]:
        return {
            f"x-ratelimit-limit-{kind}": str(int(self.capacity)),
            f"x-ratelimit-remaining-{kind}": str(max(0, math.floor(self.level))),
            f"x-ratelimit-reset-{kind}": format_duration((self.capacity - self.level) / self.rate),
        }


class Limiter:
    """The server side of a rate limit: admits or refuses each request (thread-safe)."""

    def __init__(self, rps: float | None, tps: float | None, burst_s: float,
                 headers: bool = True) -> None:
        self.requests = _Bucket(rps, burst_s) if rps else None
        self.tokens = _Bucket(tps, burst_s) if tps else None
        self.send_headers = headers
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def admit(self, tokens: float) -> tuple[float | None, str | None, dict[str, str]]:
        """Charge a request of ``tokens`` tokens: ``(None, None, headers)`` when it is
        admitted, else ``(retry_after_s, "requests" | "tokens", headers)`` (not charged)."""
        now = time.monotonic()
        with self._lock:
            waits: list[tuple[float, str]] = []
            for bucket, kind, amount in ((self.requests, "requests", 1.0),
                                         (self.tokens, "tokens", tokens)):
                if bucket is not None:
                    bucket.refill(now)
                    wait = bucket.wait_for(amount)
                    if wait > 0:
                        waits.append((wait, kind))
            if not waits:
                if self.requests is not None:
                    self.requests.level -= 1.0
                if self.tokens is not None:
                    self.tokens.level -= min(tokens, self.tokens.capacity)
                return None, None, self._headers()
            wait, kind = max(waits)
            return wait, kind, self._headers()

    def _headers(self) -> dict[str, str]:
        """The x-ratelimit headers of the buckets as they are now (call under the lock)."""
        if not self.send_headers:
            return {}
        headers: dict[str, str] = {}
        if self.requests is not None:
            headers |= self.requests.headers("requests")
        if self.tokens is not None:
            headers |= self.tokens.headers("tokens")
        return headers

    def headers(self) -> dict[str, str]:
        """The x-ratelimit headers now (for answers the server refuses for other reasons)."""
        now = time.monotonic()
        with self._lock:
            for bucket in (self.requests, self.tokens):
                if bucket is not None:
                    bucket.refill(now)
            return self._headers()
