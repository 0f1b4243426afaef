"""Per-backend rate limits: in-flight slots, RPM/TPM token buckets and 429 pacing (anyio)."""

from __future__ import annotations

import time

import anyio


class TokenBucket:
    """A bucket refilled continuously at ``per_minute / 60`` units per second.

    Waiters are served in arrival order (the lock is held while waiting), so a big request is
    not starved by a stream of small ones.
    """

    def __init__(self, per_minute: float, capacity: float | None = None) -> None:
        self.rate = per_minute / 60.0
        self.capacity = capacity if capacity is not None else per_minute
        self.level = self.capacity
        self.updated = time.monotonic()
        self._lock = anyio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    async def acquire(self, amount: float = 1.0) -> None:
        """Wait until ``amount`` units are available and take them."""
        amount = min(amount, self.capacity)
        async with self._lock:
            while True:
                self._refill()
                if self.level >= amount:
                    self.level -= amount
                    return
                await anyio.sleep((amount - self.level) / self.rate)


class RateLimitBackoff:
    """How fast one backend is sent requests while it answers 429 (rate limited).

    Each 429 doubles the gap between the starts of the backend's requests (from
    :attr:`MIN_GAP_S` up to :attr:`MAX_GAP_S`), at most once per step: a 429 to a request that
    started before the last increase does not count again, so sixteen requests refused at once
    slow the backend down one step, not sixteen. A ``Retry-After`` holds every request of the
    backend until it has passed (at most :attr:`MAX_HOLD_S`). Each answer that is not a 429
    shrinks the gap by a tenth and below :attr:`MIN_GAP_S` it is gone: the rate recovers once
    the 429s stop. ``scale`` multiplies every wait (tests run at ``sleep_scale`` 0).
    """

    MIN_GAP_S = 0.05
    MAX_GAP_S = 10.0
    MAX_HOLD_S = 60.0
    RECOVERY = 0.9

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        #: Seconds between the starts of two requests (0: no pacing).
        self.gap = 0.0
        #: How many times the gap has grown; a request's step is the value when it started.
        self.step = 0
        self._next = 0.0  # when the next request may start (monotonic)
        self._hold = 0.0  # no request starts before this (a Retry-After)

    async def wait(self) -> int:
        """Wait for this request's turn; returns its step (for :meth:`rate_limited`)."""
        now = time.monotonic()
        if self.gap > 0 or self._hold > now:
            start = max(now, self._next, self._hold)
            self._next = start + self.gap * self.scale
            if start > now:
                await anyio.sleep(start - now)
        return self.step

    def rate_limited(self, step: int, retry_after: float | None = None) -> None:
        """A request that started at ``step`` was answered 429 (``retry_after``: the server's
        requested delay in seconds, if it gave one)."""
        if retry_after:
            hold = min(retry_after, self.MAX_HOLD_S) * self.scale
            self._hold = max(self._hold, time.monotonic() + hold)
        if step == self.step:
            self.gap = min(self.MAX_GAP_S, max(self.MIN_GAP_S, self.gap * 2))
            self.step += 1

    def answered(self) -> None:
        """A request was answered with something other than a 429."""
        if self.gap:
            self.gap *= self.RECOVERY
            if self.gap < self.MIN_GAP_S:
                self.gap = 0.0


class BackendLimits:
    """The limits of one backend: concurrency slots, optional RPM and TPM buckets, and the
    pacing that slows it down while it answers 429 (:class:`RateLimitBackoff`)."""

    def __init__(self, max_concurrency: int, rpm: int | None, tpm: int | None,
                 scale: float = 1.0) -> None:
        self.slots = anyio.CapacityLimiter(max_concurrency)
        self.rpm = TokenBucket(rpm) if rpm else None
        self.tpm = TokenBucket(tpm) if tpm else None
        self.backoff = RateLimitBackoff(scale)

    async def admit(self, estimated_tokens: int) -> int:
        """Wait for the 429 pacing and the rate buckets (call inside ``async with self.slots``);
        returns the request's backoff step (:meth:`RateLimitBackoff.rate_limited`)."""
        step = await self.backoff.wait()
        if self.rpm is not None:
            await self.rpm.acquire(1)
        if self.tpm is not None:
            await self.tpm.acquire(estimated_tokens)
        return step
