"""Field types shared by the harness's structured-output models.

Every string has a ``maxLength`` and every list a ``maxItems``: llama.cpp turns them into
grammar limits, so a small embedded model cannot ramble until ``max_tokens`` cuts the JSON in
half. Values a model gets slightly wrong (a 130 on a 0–100 scale, one list item too many) are
clamped or truncated *before* validation instead of failing it, because a re-ask costs a whole
call and the hard limits are enforced in code anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _require_all(schema: dict[str, Any]) -> None:
    schema["required"] = list(schema.get("properties", {}))


class Record(BaseModel):
    """Base of harness records: unknown keys are ignored (models add chatter), values typed."""

    model_config = ConfigDict(extra="ignore")


class Reply(Record):
    """A structured reply a model must give in full.

    Its JSON schema lists every property as required, so grammar-constrained decoding
    (llama.cpp) and strict providers produce all of them, while parsing still fills a default
    for a key a lenient provider left out instead of failing the whole reply.
    """

    model_config = ConfigDict(extra="ignore", json_schema_extra=_require_all)


def _truncate(n: int) -> Callable[[Any], Any]:
    def cut(value: Any) -> Any:
        if isinstance(value, str):
            return value.strip()[:n]
        return value

    return cut


def _clamp(lo: int, hi: int) -> Callable[[Any], Any]:
    def clamp(value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            return round(min(hi, max(lo, float(value))))
        return value

    return clamp


def _head(n: int) -> Callable[[Any], Any]:
    def head(value: Any) -> Any:
        if isinstance(value, list):
            return value[:n]
        return value

    return head


#: The values a model may write for a score. llama.cpp ignores ``minimum``/``maximum`` when it
#: builds a grammar, and a small model then writes "fact": 123456789… until max_tokens cuts
#: the JSON; an enum bounds it. Steps of 5 keep the grammar small; parsing accepts any integer.
SCORE_CHOICES = list(range(0, 101, 5))

Score = Annotated[
    int,
    Field(ge=0, le=100, json_schema_extra={"enum": SCORE_CHOICES}),
    BeforeValidator(_clamp(0, 100)),
]
"""An integer on the 0–100 scale every harness value uses (clamped, never rejected)."""

Short = Annotated[str, Field(max_length=60), BeforeValidator(_truncate(60))]
"""A label or a name."""

Phrase = Annotated[str, Field(max_length=80), BeforeValidator(_truncate(80))]
"""A short phrase: a quote, a violation, a belief."""

Line = Annotated[str, Field(max_length=140), BeforeValidator(_truncate(140))]
"""One sentence: a fact, a rule, a question, a piece of advice."""


Phrases3 = Annotated[list[Phrase], Field(max_length=3), BeforeValidator(_head(3))]
Lines3 = Annotated[list[Line], Field(max_length=3), BeforeValidator(_head(3))]
Lines5 = Annotated[list[Line], Field(max_length=5), BeforeValidator(_head(5))]
Lines8 = Annotated[list[Line], Field(max_length=8), BeforeValidator(_head(8))]
Lines10 = Annotated[list[Line], Field(max_length=10), BeforeValidator(_head(10))]
Shorts6 = Annotated[list[Short], Field(max_length=6), BeforeValidator(_head(6))]
