"""Per-backend rate limits: in-flight slots and RPM/TPM token buckets (anyio)."""

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


class BackendLimits:
    """The limits of one backend: concurrency slots plus optional RPM and TPM buckets."""

    def __init__(self, max_concurrency: int, rpm: int | None, tpm: int | None) -> None:
        self.slots = anyio.CapacityLimiter(max_concurrency)
        self.rpm = TokenBucket(rpm) if rpm else None
        self.tpm = TokenBucket(tpm) if tpm else None

    async def admit(self, estimated_tokens: int) -> None:
        """Wait for the rate buckets (call inside ``async with self.slots``)."""
        if self.rpm is not None:
            await self.rpm.acquire(1)
        if self.tpm is not None:
            await self.tpm.acquire(estimated_tokens)
