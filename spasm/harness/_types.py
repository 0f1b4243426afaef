"""Field types shared by the harness's structured-output models.

Every string has a ``maxLength`` and every list a ``maxItems``: llama.cpp turns them into
grammar limits, so a small embedded model cannot ramble until ``max_tokens`` cuts the JSON in
half. Values a model gets slightly wrong (a 130 on a 0–100 scale, one list item too many) are
clamped or truncated *before* validation instead of failing it, because a re-ask costs a whole
call and the hard limits are enforced in code anyway.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field

# The stored state is built from the same bounded types: they are declared with it, in the
# format layer (turns.state), and the structured replies below reuse them.
from spasm.dataset.columns import (
    SCORE_CHOICES,
    Line,
    Lines5,
    Record,
    Score,
    first_items,
    truncate_to,
)

__all__ = [
    "SCORE_CHOICES", "Line", "Lines3", "Lines5", "Lines8", "Lines10", "Phrase", "Phrases3",
    "Record", "Reply", "Score", "Short", "Shorts6",
]


def _require_all(schema: dict[str, Any]) -> None:
    schema["required"] = list(schema.get("properties", {}))


class Reply(Record):
    """A structured reply a model must give in full.

    Its JSON schema lists every property as required, so grammar-constrained decoding
    (llama.cpp) and strict providers produce all of them, while parsing still fills a default
    for a key a lenient provider left out instead of failing the whole reply.
    """

    model_config = ConfigDict(extra="ignore", json_schema_extra=_require_all)


Short = Annotated[str, Field(max_length=60), BeforeValidator(truncate_to(60))]
"""A label or a name."""

Phrase = Annotated[str, Field(max_length=80), BeforeValidator(truncate_to(80))]
"""A short phrase: a quote, a violation, a belief."""


Phrases3 = Annotated[list[Phrase], Field(max_length=3), BeforeValidator(first_items(3))]
Lines3 = Annotated[list[Line], Field(max_length=3), BeforeValidator(first_items(3))]
Lines8 = Annotated[list[Line], Field(max_length=8), BeforeValidator(first_items(8))]
Lines10 = Annotated[list[Line], Field(max_length=10), BeforeValidator(first_items(10))]
Shorts6 = Annotated[list[Short], Field(max_length=6), BeforeValidator(first_items(6))]
