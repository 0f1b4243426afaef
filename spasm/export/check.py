"""``spasm export --check FILE``: the format checks OpenAI publishes for chat fine-tuning data.

Following OpenAI's data-preparation notebook for chat models: every line parses as a JSON
object; it has a ``messages`` list; every message has a ``role`` among system, user,
assistant, tool and function, and non-empty string ``content`` (an assistant message with
``tool_calls`` or ``function_call`` may have none); no unknown keys (top level or in a
message); ``weight``, where present, is 0 or 1 and on an assistant message; at least one
assistant message; and tool use as :func:`spasm.export.tooluse.tool_problems` checks it (call
ids, JSON arguments against the tool's schema, results following their calls). Those are
problems (the file fails). As in the notebook, these are
warnings, counted and shown with their lines: examples missing a system message, examples
missing a user message, and examples over a token count (the notebook's count: 3 per message,
the tokens of each value, 1 per ``name``, 3 to prime the reply). The token limit depends on
the model, so by default an example over :data:`WARN_TOKENS` is only a warning; a limit given
(``--token-limit``) is enforced.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from spasm.errors import UserError
from spasm.export.tooluse import tool_problems
from spasm.tokens import count_tokens, counter_source

__all__ = ["WARN_TOKENS", "CheckReport", "check_examples", "check_openai_file", "example_problems",
           "example_tokens", "example_warnings"]

#: Tokens per example above which the check warns when no limit is given. The limit depends on
#: the model (16,385 for the first chat fine-tuning models, 65,536 for newer ones), and OpenAI's
#: notebook only warns (longer examples are truncated); ``--token-limit`` enforces one.
WARN_TOKENS = 65_536
#: The fewest examples OpenAI's fine-tuning accepts in a training (or validation) file.
OPENAI_MIN_EXAMPLES = 10
_TOP_KEYS = {"messages", "tools", "parallel_tool_calls"}
_MESSAGE_KEYS = {"role", "content", "name", "weight", "tool_calls", "tool_call_id", "function_call"}
_ROLES = {"system", "user", "assistant", "tool", "function"}
_SHOWN = 20


class CheckReport(BaseModel):
    """What the check found; ``passed`` when there are no problems (warnings do not fail)."""

    file: str
    examples: int
    problems: dict[str, int]
    #: Counted but not failing: ``missing_system_message``, ``missing_user_message`` and,
    #: unless the limit is enforced, ``over_token_limit``.
    warnings: dict[str, int] = {}
    #: The first lines of each problem and warning kind.
    lines: dict[str, list[int]] = {}
    #: The first problems, as ``line N: what`` (with the parser's message for bad JSON).
    examples_of_problems: list[str]
    token_limit: int
    #: Whether an example over ``token_limit`` fails the check (a limit was given).
    token_limit_enforced: bool = True
    tokens_min: int
    tokens_mean: float
    tokens_max: int
    over_limit: int
    token_counter: str

    @property
    def passed(self) -> bool:
        return not self.problems and self.examples > 0

    def _kind(self, kind: str, n: int) -> str:
        shown = self.lines.get(kind, [])
        where = ""
        if shown:
            more = ", …" if n > len(shown) else ""
            where = " (line" + ("s " if len(shown) > 1 else " ") + ", ".join(map(str, shown)) + more + ")"
        return f"  {kind}: {n}{where}"

    def text(self) -> str:
        """A short human-readable report."""
        lines = [f"{self.file}: {self.examples} examples; "
                 + ("passes the OpenAI chat fine-tuning format checks" if self.passed
                    else "FAILS the OpenAI chat fine-tuning format checks")]
        how = ("enforced" if self.token_limit_enforced
               else "a warning: the limit depends on the model; --token-limit N enforces one")
        lines.append(f"tokens per example: min {self.tokens_min}, mean {self.tokens_mean:.0f}, max "
                     f"{self.tokens_max} ({self.token_counter}); {self.over_limit} over {self.token_limit:,} "
                     f"({how})")
        lines.append(f"examples missing a system message: {self.warnings.get('missing_system_message', 0)}; "
                     f"missing a user message: {self.warnings.get('missing_user_message', 0)}")
        if self.problems:
            lines.append("problems:")
            lines += [self._kind(k, n) for k, n in sorted(self.problems.items())]
        if self.warnings:
            lines.append("warnings:")
            lines += [self._kind(k, n) for k, n in sorted(self.warnings.items())]
        if self.examples_of_problems:
            lines.append("first problems:")
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
        content = m.get("content")
        calls = m.get("role") == "assistant" and bool(m.get("tool_calls") or m.get("function_call"))
        if content is None and calls:
            pass  # an assistant message that calls a tool may have no text
        elif not isinstance(content, str):
            problems.append("missing_or_non_string_content")
        elif not content.strip():
            problems.append("empty_content")
        if "weight" in m and (m["weight"] not in (0, 1) or isinstance(m["weight"], bool)
                              or m.get("role") != "assistant"):
            problems.append("bad_weight")
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        problems.append("example_missing_assistant_message")
    return problems + tool_problems(example)


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


def example_warnings(example: Any) -> list[str]:
    """What OpenAI's notebook counts but does not reject: no system or no user message."""
    messages = example.get("messages") if isinstance(example, dict) else None
    if not isinstance(messages, list) or not messages:
        return []
    roles = {m.get("role") for m in messages if isinstance(m, dict)}
    return [f"missing_{r}_message" for r in ("system", "user") if r not in roles]


def _parse(line: str) -> tuple[Any, str | None]:
    try:
        return json.loads(line), None
    except json.JSONDecodeError as exc:
        return None, f"invalid_json ({exc.msg})"
    except (ValueError, RecursionError):  # Python's own limits: 4,300 digits, ~1,000 levels
        return None, "invalid_json (a number with thousands of digits, or nesting too deep)"


def check_examples(
    lines: Iterable[tuple[int, str]], *, file: str, token_limit: int | None = None
) -> CheckReport:
    """Check ``(line number, line)`` pairs of an OpenAI chat JSONL file. ``token_limit``
    ``None``: warn above :data:`WARN_TOKENS`; a number: an example above it fails."""
    if token_limit is not None and token_limit < 1:
        raise UserError("--token-limit must be at least 1")
    limit = WARN_TOKENS if token_limit is None else token_limit
    problems: Counter[str] = Counter()
    warnings: Counter[str] = Counter()
    where: dict[str, list[int]] = {}
    shown: list[str] = []
    tokens: list[int] = []
    over = n = 0
    for lineno, line in lines:
        found: list[str] = []
        warned: list[str] = []
        if not line.strip():
            found = ["blank_line"]
        else:
            n += 1
            example, error = _parse(line)
            if error is not None:
                found = [error]
            else:
                found, warned = example_problems(example), example_warnings(example)
                if isinstance(example, dict):
                    count = example_tokens(example)
                    tokens.append(count)
                    if count > limit:
                        over += 1
                        (found if token_limit is not None else warned).append("over_token_limit")
        for p in found:
            kind = p.split(" (")[0]
            problems[kind] += 1
            if len(shown) < _SHOWN:
                shown.append(f"line {lineno}: {p}")
            if len(where.setdefault(kind, [])) < _SHOWN:
                where[kind].append(lineno)
        for w in warned:
            warnings[w] += 1
            if len(where.setdefault(w, [])) < _SHOWN:
                where[w].append(lineno)
    if n == 0:
        problems["no_examples"] += 1
    return CheckReport(
        file=file, examples=n, problems=dict(problems), warnings=dict(sorted(warnings.items())),
        lines=dict(sorted(where.items())), examples_of_problems=shown, token_limit=limit,
        token_limit_enforced=token_limit is not None, tokens_min=min(tokens, default=0),
        tokens_mean=sum(tokens) / len(tokens) if tokens else 0.0, tokens_max=max(tokens, default=0),
        over_limit=over, token_counter=counter_source(),
    )


def check_openai_file(path: str | Path, *, token_limit: int | None = None) -> CheckReport:
    """Check one OpenAI chat JSONL file (streamed line by line); see :func:`check_examples`."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(str(p) for p in path.glob("**/*.jsonl"))[:3]
        raise UserError(f"--check {path} is a directory; --check takes one JSONL file"
                        + (f", e.g. {', '.join(inside)}" if inside else
                           " (an export's DIR/openai/train.jsonl)") + ".")
    if not path.is_file():
        raise UserError(f"--check {path}: no such file; pass an exported JSONL file "
                        "(e.g. DIR/openai/train.jsonl)")
    if token_limit is not None and token_limit < 1:
        raise UserError("--token-limit must be at least 1")
    try:
        with path.open(encoding="utf-8") as fh:
            return check_examples(enumerate(fh, 1), file=str(path), token_limit=token_limit)
    except UnicodeDecodeError as exc:
        raise UserError(f"--check {path}: not UTF-8 text ({exc.reason}); is it a JSONL file?") from None
