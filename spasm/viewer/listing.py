"""The dialogue list's query: filters, search, sort and page, parsed from a URL and turned into
SQL with parameters (never with request text pasted into the statement)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spasm.errors import UserError

__all__ = ["SORTS", "ListQuery", "where_clause"]

#: Sort keys offered in the list, and the ``dlg`` column each sorts by.
SORTS: dict[str, str] = {
    "id": "dialogue_id",
    "persona": "persona_id",
    "condition": "condition",
    "level": "harness_level",
    "pairing": "pairing",
    "utterances": "n_utterances",
    "reason": "termination_reason",
    "tokens": "tokens",
    "flagged": "n_flagged",
    "clips": "n_clips",
    "echo": "echo_score",
    "hits": "n_hits",
}

_EQUALS = {"pairing": "pairing", "condition": "condition", "level": "harness_level",
           "reason": "termination_reason", "status": "status"}


class ListQuery(BaseModel):
    """What the dialogue list shows: ``/dialogues?condition=concat&q=refund&sort=tokens&desc=1``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pairing: str | None = Field(None, max_length=200)
    condition: str | None = Field(None, max_length=200)
    level: str | None = Field(None, max_length=200)
    reason: str | None = Field(None, max_length=200)
    status: str | None = Field(None, max_length=200)
    #: a QA finding kind, ``any`` or ``none``
    qa: str | None = Field(None, max_length=200)
    echo: Literal["yes", "no", "client", "responder"] | None = None
    flagged: Literal["yes", "no"] | None = None
    #: utterances in another language than the persona's: yes / no, or by one side
    lang: Literal["yes", "no", "client", "responder"] | None = None
    #: none: nobody labelled it; any; mine / notmine: by the current annotator; multi: two or more
    ann: Literal["none", "any", "mine", "notmine", "multi"] | None = None
    #: full-text search in the utterances (case-insensitive substring)
    q: str = Field("", max_length=200)
    #: persona field -> exact value (``p.<field>=…``)
    persona: dict[str, str] = Field(default_factory=dict)
    #: integer persona field -> bounds (``pmin.<field>``, ``pmax.<field>``)
    persona_min: dict[str, int] = Field(default_factory=dict)
    persona_max: dict[str, int] = Field(default_factory=dict)
    sort: Literal[
        "id", "persona", "condition", "level", "pairing", "utterances", "reason", "tokens",
        "flagged", "clips", "echo", "hits",
    ] = "id"
    desc: bool = False
    page: int = Field(1, ge=1, le=1_000_000)
    per_page: int = Field(50, ge=10, le=200)

    @classmethod
    def from_params(cls, items: Iterable[tuple[str, str]]) -> ListQuery:
        """Parse URL query parameters; a bad value is a :class:`UserError` naming it."""
        data: dict[str, Any] = {"persona": {}, "persona_min": {}, "persona_max": {}}
        for key, value in items:
            value = value.strip()
            if key in ("token", "from"):
                continue
            if value == "":
                continue
            for prefix, target in (("p.", "persona"), ("pmin.", "persona_min"), ("pmax.", "persona_max")):
                if key.startswith(prefix):
                    data[target][key[len(prefix):]] = value
                    break
            else:
                data[key] = value
        if data.get("desc") in ("0", "false"):
            data["desc"] = False
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise UserError(f"Bad list parameter {where!r}: {err['msg']}.") from None

    def params(self, **changes: Any) -> list[tuple[str, str]]:
        """The query as URL parameters (defaults left out), with ``changes`` applied."""
        q = self.model_copy(update=changes)
        out: list[tuple[str, str]] = []
        defaults = ListQuery()
        for name in ("pairing", "condition", "level", "reason", "status", "qa", "echo", "flagged", "lang",
                     "ann", "q", "sort", "desc", "page", "per_page"):
            value = getattr(q, name)
            if value != getattr(defaults, name) and value is not None:
                out.append((name, "1" if value is True else str(value)))
        out += [(f"p.{k}", v) for k, v in sorted(q.persona.items())]
        out += [(f"pmin.{k}", str(v)) for k, v in sorted(q.persona_min.items())]
        out += [(f"pmax.{k}", str(v)) for k, v in sorted(q.persona_max.items())]
        return out

    def url(self, **changes: Any) -> str:
        """``/dialogues?…`` for this query with ``changes``."""
        encoded = urlencode(self.params(**changes))
        return "/dialogues" + ("?" + encoded if encoded else "")

    def encoded(self) -> str:
        """The query as one URL-encoded string (the ``from`` parameter of a dialogue link)."""
        return urlencode(self.params())

    def order_by(self) -> str:
        """The ORDER BY clause (the id breaks ties, so paging is stable)."""
        column = SORTS[self.sort]
        if column == "n_hits" and not self.q:
            column = "dialogue_id"
        direction = "DESC" if self.desc else "ASC"
        return f"{column} {direction} NULLS LAST, dialogue_id {direction}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def where_clause(query: ListQuery, persona_fields: set[str]) -> tuple[str, dict[str, Any]]:
    """The WHERE clause over ``dlg`` (and the registered ``ann`` table) and its parameters.

    Raises:
        UserError: a persona filter names a field the run does not have.
    """
    clauses: list[str] = ["TRUE"]
    params: dict[str, Any] = {}
    for name, column in _EQUALS.items():
        value = getattr(query, name)
        if value is not None:
            clauses.append(f"{column} = ${name}")
            params[name] = value
    if query.qa == "any":
        clauses.append("len(qa_kinds) > 0")
    elif query.qa == "none":
        clauses.append("len(qa_kinds) = 0")
    elif query.qa is not None:
        clauses.append("list_contains(qa_kinds, $qa)")
        params["qa"] = query.qa
    if query.echo in ("yes", "no"):
        clauses.append("echoing" if query.echo == "yes" else "NOT echoing")
    elif query.echo is not None:
        clauses.append("echo_who = $echo")
        params["echo"] = query.echo
    if query.flagged is not None:
        clauses.append("n_flagged > 0" if query.flagged == "yes" else "n_flagged = 0")
    if query.lang is not None:
        clauses.append({
            "yes": "off_language_client + off_language_responder > 0",
            "no": "off_language_client + off_language_responder = 0",
            "client": "off_language_client > 0", "responder": "off_language_responder > 0",
        }[query.lang])
    ann = {
        "none": "dialogue_id NOT IN (SELECT dialogue_id FROM ann)",
        "any": "dialogue_id IN (SELECT dialogue_id FROM ann)",
        "mine": "dialogue_id IN (SELECT dialogue_id FROM ann WHERE mine)",
        "notmine": "dialogue_id NOT IN (SELECT dialogue_id FROM ann WHERE mine)",
        "multi": "dialogue_id IN (SELECT dialogue_id FROM ann WHERE n_annotators >= 2)",
    }
    if query.ann is not None:
        clauses.append(ann[query.ann])
    fields = {**query.persona, **query.persona_min, **query.persona_max}
    unknown = sorted(set(fields) - persona_fields)
    if unknown:
        raise UserError(f"This run's personas have no field {unknown[0]!r}.")
    for i, (name, value) in enumerate(sorted(query.persona.items())):
        clauses.append(f"CAST({_ident('p_' + name)} AS VARCHAR) = $pv{i}")
        params[f"pv{i}"] = value
    for bound, op, values in (("lo", ">=", query.persona_min), ("hi", "<=", query.persona_max)):
        for i, (name, value) in enumerate(sorted(values.items())):
            clauses.append(f"{_ident('p_' + name)} {op} ${bound}{i}")
            params[f"{bound}{i}"] = value
    return " AND ".join(clauses), params
