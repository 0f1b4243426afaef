"""Seeded persona sampler: the same seed gives the same candidates on any machine.

We use :class:`random.Random`, whose Mersenne Twister stream and ``choices``/``randint``
algorithms are fixed across platforms and Python versions we support.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from spasm.personas.schema import ChoiceField, DerivedField, IntegerField, PersonaSchema


def sample_candidate(schema: PersonaSchema, rng: random.Random) -> dict[str, Any]:
    """Draw one candidate persona's fields (not yet validated)."""
    fields: dict[str, Any] = {}
    chosen: dict[str, Any] = {}
    for name, spec in schema.fields.items():
        if isinstance(spec, IntegerField):
            fields[name] = rng.randint(spec.min, spec.max)
        elif isinstance(spec, ChoiceField):
            choice = rng.choices(spec.values, weights=[c.weight for c in spec.values])[0]
            chosen[name] = choice
            fields[name] = choice.value
    for name, spec in schema.fields.items():
        if isinstance(spec, DerivedField):
            src = spec.from_.partition(".")[0]
            pool = chosen[src].concerns
            fields[name] = rng.choice(pool) if pool else ""
    return fields


def candidates(schema: PersonaSchema, seed: int) -> Iterator[dict[str, Any]]:
    """An endless, reproducible stream of candidates for ``seed``."""
    rng = random.Random(seed)
    while True:
        yield sample_candidate(schema, rng)
