"""The persona schema: field pools and declarative coherence rules, loaded from YAML
(schemas/persona.yaml is the bundled one)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spasm.config import data_path, format_validation_error, read_yaml
from spasm.errors import ConfigError
from spasm.language import language_code

#: The persona field that names the Client's language (optional: without it a persona is
#: English and its card, frames and personas row are those of a schema without the field).
LANGUAGE_FIELD = "language"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Choice(_Strict):
    """One value of a categorical/ordinal field, with an optional weight and extra data."""

    value: str
    weight: float = Field(1.0, gt=0)
    concerns: list[str] = []

    @field_validator("value")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a value must not be empty (a card would read \"You are .\")")
        return v

    @field_validator("concerns")
    @classmethod
    def _no_blank_concern(cls, v: list[str]) -> list[str]:
        if any(not c.strip() for c in v):
            raise ValueError("a concern must not be empty")
        return v


class IntegerField(_Strict):
    type: Literal["integer"]
    min: int
    max: int

    @model_validator(mode="after")
    def _range(self) -> IntegerField:
        if self.min > self.max:
            raise ValueError("min is above max")
        return self


class ChoiceField(_Strict):
    type: Literal["categorical", "ordinal"]
    values: list[Choice]

    @field_validator("values", mode="before")
    @classmethod
    def _plain_strings(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"value": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("values")
    @classmethod
    def _unique(cls, v: list[Choice]) -> list[Choice]:
        if not v:
            raise ValueError("needs at least one value")
        names = [c.value for c in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate values {dupes}")
        return v


class DerivedField(_Strict):
    """A field drawn from a list attached to the chosen value of another field."""

    type: Literal["derived"]
    #: ``<field>.<attribute>``, e.g. ``domain.concerns``.
    from_: str = Field(alias="from")


FieldSpec = Annotated[IntegerField | ChoiceField | DerivedField, Field(discriminator="type")]


class Condition(_Strict):
    """A test on one field: membership (``in``/``not_in``) or an inclusive range."""

    in_: list[str] | None = Field(None, alias="in")
    not_in: list[str] | None = None
    min: int | None = None
    max: int | None = None

    def holds(self, value: Any) -> bool:
        if self.in_ is not None and value not in self.in_:
            return False
        if self.not_in is not None and value in self.not_in:
            return False
        if self.min is not None and (not isinstance(value, int) or value < self.min):
            return False
        return not (self.max is not None and (not isinstance(value, int) or value > self.max))

    def describe(self) -> str:
        parts = []
        if self.in_ is not None:
            parts.append(f"in {self.in_}")
        if self.not_in is not None:
            parts.append(f"not in {self.not_in}")
        if self.min is not None:
            parts.append(f"≥ {self.min}")
        if self.max is not None:
            parts.append(f"≤ {self.max}")
        return " and ".join(parts)


class Rule(_Strict):
    """Reject a persona when every ``when`` condition holds and some ``require`` one does not."""

    id: str
    description: str
    when: dict[str, Condition] = {}
    require: dict[str, Condition]

    def violation(self, fields: dict[str, Any]) -> str | None:
        """The reason this rule rejects a candidate's ``fields``, or ``None`` if it passes."""
        if not all(c.holds(fields.get(f)) for f, c in self.when.items()):
            return None
        failed = [f for f, c in self.require.items() if not c.holds(fields.get(f))]
        if not failed:
            return None
        detail = ", ".join(
            f"{f}={fields.get(f)!r} (needs {self.require[f].describe()})" for f in failed
        )
        return f"{self.id}: {self.description} [{detail}]"


class PersonaSchema(_Strict):
    """A whole persona schema file."""

    schema_version: str
    name: str
    description: str = ""
    fields: dict[str, FieldSpec]
    rules: list[Rule] = []

    @model_validator(mode="after")
    def _references(self) -> PersonaSchema:
        if not self.fields:
            raise ValueError("fields: a schema needs at least one field (a persona of nothing "
                             "has the card \"You are .\")")
        for name, spec in self.fields.items():
            if isinstance(spec, DerivedField):
                src, _, attr = spec.from_.partition(".")
                source = self.fields.get(src)
                if not isinstance(source, ChoiceField) or attr != "concerns":
                    raise ValueError(f"field {name!r}: 'from' must be <choice field>.concerns")
                empty = [c.value for c in source.values if not c.concerns]
                if empty:
                    raise ValueError(
                        f"field {name!r} draws from {spec.from_}, but {src} value(s) "
                        f"{', '.join(map(repr, empty[:3]))} have no concerns (an empty pool): "
                        "give each value at least one")
        language = self.fields.get(LANGUAGE_FIELD)
        if language is not None:
            if not isinstance(language, ChoiceField):
                raise ValueError(f"field {LANGUAGE_FIELD!r} names the Client's language: it must be "
                                 "categorical (one value: every persona speaks it; several: drawn)")
            unknown = [c.value for c in language.values if language_code(c.value) is None]
            if unknown:
                raise ValueError(
                    f"field {LANGUAGE_FIELD!r}: {unknown[0]!r} is not a language (use an ISO 639-1 "
                    "code such as 'es', a tag such as 'pt-BR' or an English name such as 'Spanish')")
        for rule in self.rules:
            for f in (*rule.when, *rule.require):
                if f not in self.fields:
                    raise ValueError(f"rule {rule.id!r} names unknown field {f!r}")
            for f, cond in (*rule.when.items(), *rule.require.items()):
                spec = self.fields[f]
                if isinstance(spec, ChoiceField):
                    known = {c.value for c in spec.values}
                    for v in (cond.in_ or []) + (cond.not_in or []):
                        if v not in known:
                            raise ValueError(f"rule {rule.id!r}: {v!r} is not a value of {f!r}")
        return self

    @property
    def field_names(self) -> list[str]:
        return list(self.fields)

    def integer_fields(self) -> set[str]:
        return {n for n, s in self.fields.items() if isinstance(s, IntegerField)}


def default_schema_path() -> Path:
    """The bundled schema (``schemas/persona.yaml``)."""
    return data_path("schemas", "persona.yaml")


def load_schema(path: str | Path | None = None) -> PersonaSchema:
    """Read and validate a persona schema file (the bundled one by default)."""
    p = Path(path) if path is not None else default_schema_path()
    try:
        stamp = p.stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"Cannot read persona schema {p}: {exc.strerror}") from None
    return _load_schema(p.resolve(), stamp)


@functools.lru_cache(maxsize=8)
def _load_schema(p: Path, stamp: int) -> PersonaSchema:
    """Parse once per file version (schemas are immutable models, so sharing is safe)."""
    data = read_yaml(p, "persona schema")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a persona schema must be a mapping (name, fields, rules, ...)")
    try:
        return PersonaSchema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(p))) from None
