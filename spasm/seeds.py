"""Seeds derived from parts: the one function every layer uses (a leaf: imports nothing)."""

from __future__ import annotations

import hashlib
import json

__all__ = ["derive_seed"]


def derive_seed(*parts: object) -> int:
    """A 31-bit seed derived from any parts (stable across machines)."""
    digest = hashlib.sha256(json.dumps(parts, default=str).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
