"""``spasm export --check FILE``: the format checks OpenAI publishes for chat fine-tuning data.

Following OpenAI's data-preparation notebook for chat models: every line parses as a JSON
object; it has a ``messages`` list; every message has a ``role`` among system/user/assistant
and string ``content``; no unknown keys (top level or in a message); ``weight``, where
present, is 0 or 1 and on an assistant message; at least one assistant message; and the
tokens of an example (the notebook's count: 3 per message, the tokens of each value, 1 per
``name``, 3 to prime the reply) are under a limit, reported as min/mean/max.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from spasm.errors import UserError
from spasm.tokens import count_tokens, counter_source

__all__ = ["DEFAULT_TOKEN_LIMIT", "CheckReport", "check_openai_file", "example_problems", "example_tokens"]

#: Tokens per training example: the limit of OpenAI's published checks (16,385, the context of
#: the first chat fine-tuning models); newer models train on longer examples (--token-limit).
DEFAULT_TOKEN_LIMIT = 16_385
_TOP_KEYS = {"messages", "tools", "parallel_tool_calls"}
_MESSAGE_KEYS = {"role", "content", "name", "weight"}
_ROLES = {"system", "user", "assistant"}
_SHOWN = 20


class CheckReport(BaseModel):
    """What the check found; ``passed`` when there are no problems at all."""

    file: str
    examples: int
    problems: dict[str, int]
    #: The first problems, as ``line N: what``.
    examples_of_problems: list[str]
    token_limit: int
    tokens_min: int
    tokens_mean: float
    tokens_max: int
    over_limit: int
    token_counter: str

    @property
    def passed(self) -> bool:
        return not self.problems and self.examples > 0

    def text(self) -> str:
        """A short human-readable report."""
        lines = [f"{self.file}: {self.examples} examples; "
                 + ("passes the OpenAI chat fine-tuning format checks" if self.passed
                    else "FAILS the OpenAI chat fine-tuning format checks")]
        lines.append(f"tokens per example: min {self.tokens_min}, mean {self.tokens_mean:.0f}, max "
                     f"{self.tokens_max}; {self.over_limit} over the limit of {self.token_limit} "
                     f"({self.token_counter})")
        for kind, n in sorted(self.problems.items()):
            lines.append(f"  {kind}: {n}")
        lines += [f"  {p}" for p in self.examples_of_problems]
        return "\n".join(lines)


def example_problems(example: Any) -> list[str]:
    """The format problems of one parsed line (empty: it is a valid chat example)."""
    if not isinstance(example, dict):
        return ["not_an_object"]
    problems = [f"unknown_key:{k}" for k in sorted(set(example) - _TOP_KEYS)]
    messages = example.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "missing_messages_list"]
    for m in messages:
        if not isinstance(m, dict):
            problems.append("message_not_an_object")
            continue
        problems += [f"unknown_message_key:{k}" for k in sorted(set(m) - _MESSAGE_KEYS)]
        if m.get("role") not in _ROLES:
            problems.append(f"unrecognized_role:{m.get('role')}")
        if not isinstance(m.get("content"), str):
            problems.append("missing_or_non_string_content")
        if "weight" in m and (m["weight"] not in (0, 1) or isinstance(m["weight"], bool)
                              or m.get("role") != "assistant"):
            problems.append("bad_weight")
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        problems.append("example_missing_assistant_message")
    return problems


def example_tokens(example: dict[str, Any]) -> int:
    """Tokens of one example as OpenAI's notebook counts them."""
    total = 3
    for m in example.get("messages", []):
        if not isinstance(m, dict):
            continue
        total += 3
        for key, value in m.items():
            if isinstance(value, str):
                total += count_tokens(value)
            if key == "name":
                total += 1
    return total


def check_openai_file(path: str | Path, *, token_limit: int = DEFAULT_TOKEN_LIMIT) -> CheckReport:
    """Check one OpenAI chat JSONL file (streamed line by line)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--check {path}: no such file; pass an exported JSONL file "
                        "(e.g. DIR/openai/train.jsonl)")
    if token_limit < 1:
        raise UserError("--token-limit must be at least 1")
    problems: Counter[str] = Counter()
    shown: list[str] = []
    tokens: list[int] = []
    n = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    found = ["blank_line"]
                else:
                    n += 1
                    try:
                        example = json.loads(line)
                    except json.JSONDecodeError as exc:
                        found = [f"invalid_json ({exc.msg})"]
                    else:
                        found = example_problems(example)
                        if isinstance(example, dict):
                            count = example_tokens(example)
                            tokens.append(count)
                            if count > token_limit:
                                found.append("over_token_limit")
                for p in found:
                    problems[p.split(" (")[0]] += 1
                    if len(shown) < _SHOWN:
                        shown.append(f"line {lineno}: {p}")
    except UnicodeDecodeError as exc:
        raise UserError(f"--check {path}: not UTF-8 text ({exc.reason}); is it a JSONL file?") from None
    if n == 0:
        problems["no_examples"] += 1
    return CheckReport(
        file=str(path), examples=n, problems=dict(problems), examples_of_problems=shown,
        token_limit=token_limit, tokens_min=min(tokens, default=0),
        tokens_mean=sum(tokens) / len(tokens) if tokens else 0.0, tokens_max=max(tokens, default=0),
        over_limit=problems.get("over_token_limit", 0), token_counter=counter_source(),
    )
