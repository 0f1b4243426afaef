"""Reading one JSON value from text: a line of a JSONL file, or a whole document.

The one place that knows what can go wrong in :func:`json.loads` and tells it apart: text that
is not JSON (its message, line and column), a value past Python's own limits (a number of
thousands of digits, nesting about a thousand levels deep: a ``ValueError`` or
``RecursionError`` that is no syntax error), and, where an object is wanted, a value that is
none. Each reader (the importer, personas from a data file, scenario files) raises its own
error with the place in its own words (tests pin them) around :attr:`JSONProblem.reason`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

__all__ = ["JSONProblem", "read_json", "read_json_object"]

#: What a value past Python's limits is, after the place in a message.
LIMITS = "cannot be read: it holds a number with thousands of digits or nesting too deep"


class JSONProblem(ValueError):
    """Why a text is not the JSON wanted: ``syntax`` (not JSON: :attr:`msg` at :attr:`line`
    and :attr:`column` of the text), ``limits`` (past Python's limits) or ``not_object``."""

    def __init__(self, kind: Literal["syntax", "limits", "not_object"], msg: str = "",
                 line: int = 1, column: int = 1) -> None:
        super().__init__(kind, msg, line, column)
        self.kind = kind
        self.msg = msg
        self.line = line
        self.column = column

    @property
    def reason(self) -> str:
        """What is wrong, to follow the place in a message: ``not valid JSON (Expecting
        value)``, :data:`LIMITS` or ``not a JSON object``."""
        if self.kind == "syntax":
            return f"not valid JSON ({self.msg})"
        return LIMITS if self.kind == "limits" else "not a JSON object"


def read_json(text: str) -> Any:
    """``text`` as a JSON value, else a :class:`JSONProblem`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JSONProblem("syntax", exc.msg, exc.lineno, exc.colno) from None
    except (ValueError, RecursionError):  # Python's own limits: 4,300 digits, ~1,000 levels
        raise JSONProblem("limits") from None


def read_json_object(text: str) -> dict[str, Any]:
    """``text`` as a JSON object, else a :class:`JSONProblem` (``not_object`` for another
    value)."""
    value = read_json(text)
    if not isinstance(value, dict):
        raise JSONProblem("not_object")
    return value
