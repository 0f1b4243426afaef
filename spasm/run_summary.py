"""What a run reports: the :class:`RunSummary` of a pass, the manifest, progress lines.

The summary is what the CLI prints (one line) and what the manifest's counts come from; the
manifest is rewritten after every batch, so ``spasm status`` and a human reading it see live
progress.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spasm.dataset.rows import SCHEMA_VERSION
from spasm.plugins import installed_version, plugin_records
from spasm.tokens import counter_source
from spasm.turn_order import is_moderator_fallback

if TYPE_CHECKING:
    from spasm.calls import Caller
    from spasm.config import RunConfig
    from spasm.runner import DialogueResult

__all__ = ["RunSummary", "manifest_record", "pacing_note", "progress_lines", "rate_limit_note"]


@dataclass
class RunSummary:
    """What a run (or one pass of a resumed run) did."""

    run_dir: Path
    planned: int = 0
    completed: int = 0
    new: int = 0
    errors: int = 0
    error_types: Counter[str] = field(default_factory=Counter)
    terminations: Counter[str] = field(default_factory=Counter)
    stopped: str | None = None
    elapsed_s: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    #: Harness calls that fell back this pass (the sum of the turns' ``harness_fallbacks``).
    harness_fallbacks: int = 0
    #: Per ``harness_level``: fallbacks, and harness structured replies that parsed.
    level_fallbacks: Counter[str] = field(default_factory=Counter)
    level_parsed: Counter[str] = field(default_factory=Counter)
    #: Quarantined bugs (failures that are not run errors) by ``type: message``.
    bugs: Counter[str] = field(default_factory=Counter)
    #: Why the run failed although it may have finished (the manifest says ``failed``).
    failed: str | None = None
    #: Dialogues with a scenario whose goal judge was asked but gave no usable verdict
    #: (``goal_met`` stays null), and next speakers the ``llm`` moderator failed to pick
    #: (round robin chose instead).
    goal_unjudged: int = 0
    moderator_fallbacks: int = 0
    #: A run with tools: prompted tool steps whose reply never parsed (the turn spoke
    #: instead), and turns that used every tool step (``dialogues.reward_detail``).
    tool_fallbacks: int = 0
    tool_capped: int = 0
    #: Per backend, its pacing, 429s and waits this pass (``Caller.rate_limit_report``).
    rate_limits: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, result: DialogueResult) -> bool:
        """Count one dialogue's result; ``True`` when it completed, ``False`` when it was
        quarantined."""
        if result.error is not None:
            self.errors += 1
            self.error_types[result.error.error_type] += 1
            if result.error.traceback is not None:
                self.bugs[f"{result.error.error_type}: {result.error.error}"] += 1
            return False
        assert result.dialogue is not None
        self.new += 1
        self.completed += 1
        self.terminations[result.dialogue.termination_reason] += 1
        if (getattr(result.dialogue, "scenario_id", None) is not None
                and getattr(result.dialogue, "goal_met", None) is None
                and any(r.role == "goal_judge" for r in result.calls)):
            self.goal_unjudged += 1
        self.moderator_fallbacks += sum(
            1 for t in result.turns if is_moderator_fallback(getattr(t, "next_speaker_reason", None)))
        detail = getattr(result.dialogue, "reward_detail", None)
        if detail:
            counts = json.loads(detail)
            self.tool_fallbacks += int(counts.get("prompted_fallbacks", 0))
            self.tool_capped += int(counts.get("turns_at_step_cap", 0))
        level = result.dialogue.harness_level
        fallbacks = sum(t.harness_fallbacks for t in result.turns)
        self.harness_fallbacks += fallbacks
        self.level_fallbacks[level] += fallbacks
        # Structured replies that parsed: the final row of each ask that validated (a failed
        # parse marks its row ``invalid_output``). The termination judge is structured too,
        # but not a harness layer.
        self.level_parsed[level] += sum(
            1 for r in result.calls
            if r.role != "judge" and r.outcome in ("ok", "cache_hit")
            and json.loads(r.params).get("structured")
        )
        return True

    def bug_failure(self) -> str | None:
        """The error for a pass whose dialogues all failed on one bug, if so."""
        if self.new or not self.errors or len(self.bugs) != 1 or sum(self.bugs.values()) != self.errors:
            return None
        (bug, n), = self.bugs.items()
        return (f"all {n} dialogues of this pass failed on the same bug ({bug[:200]}); its "
                "traceback is above and in errors.parquet (column traceback). This is not a "
                "problem of the endpoint: please report it.")

    def fallback_failure(self) -> str | None:
        """The error for harness levels whose structured calls all fell back, if any."""
        dead = [lv for lv, n in sorted(self.level_fallbacks.items()) if n and not self.level_parsed[lv]]
        if not dead:
            return None
        which = ", ".join(f"{lv} ({self.level_fallbacks[lv]} fallbacks)" for lv in dead)
        return (
            f"every structured harness call fell back at harness level {which}: not one reply "
            "parsed, so those dialogues ran without the layers they test. See the calls table "
            "(outcomes invalid_output and errors); try another structured_output mode for the "
            "backend, or a model that can follow a JSON schema."
        )

    def warnings(self) -> list[str]:
        """What degraded this pass without failing it, one sentence each (the engine logs
        them; the summary line and the manifest count them)."""
        out = []
        if self.goal_unjudged:
            out.append(
                f"the goal judge gave no usable verdict for {self.goal_unjudged} dialogue(s): "
                "their goal_met is null, not false. See the calls table (role goal_judge, "
                "outcome invalid_output); set scenarios_judge.backend to a model that follows a "
                "JSON schema, or raise scenarios_judge.max_tokens.")
        if self.moderator_fallbacks:
            out.append(
                f"the llm moderator gave no usable answer {self.moderator_fallbacks} time(s); "
                "round robin chose those speakers (turns.next_speaker_reason says which). Set "
                "group.moderator_backend to a model that follows a JSON schema.")
        if self.tool_fallbacks:
            out.append(
                f"{self.tool_fallbacks} prompted tool step(s) gave no usable reply; those turns "
                "spoke without acting (dialogues.reward_detail.prompted_fallbacks says where). "
                "Use tool_mode: native, or a model that follows a JSON schema.")
        if self.tool_capped:
            out.append(
                f"{self.tool_capped} turn(s) used every tool step and were asked to speak "
                "without tools (reward_detail.turns_at_step_cap); raise dialogue.max_tool_steps "
                "if the agents need more.")
        return out

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        parts = [f"{self.completed}/{self.planned} dialogues"]
        if self.new != self.completed:
            parts.append(f"{self.new} new")
        if self.terminations:
            ended = ", ".join(f"{k} ×{v}" for k, v in sorted(self.terminations.items()))
            parts.append(f"ended by {ended}")
        if self.errors:
            why = ", ".join(f"{k} {v}" for k, v in self.error_types.most_common())
            parts.append(f"{self.errors} quarantined ({why})")
        tokens = self.usage.get("total_tokens", 0)
        parts.append(f"{tokens:,} tokens")
        typed = self.usage.get("typed_turns", 0)
        if typed:  # a person's text is no model's output: counted apart, never in the tokens
            parts.append(f"{typed} turn{'s' * (typed != 1)} typed by a person "
                         f"({self.usage.get('typed_tokens', 0):,} tokens of text, not model tokens)")
        cost = self.usage.get("cost", 0.0)
        if cost:
            parts.append(f"cost {cost:.4f}")
        parts.append(f"{self.elapsed_s:.1f}s")
        if self.harness_fallbacks:
            parts.append(f"{self.harness_fallbacks} harness fallbacks")
        if self.goal_unjudged:
            parts.append(f"{self.goal_unjudged} goal verdicts missing")
        if self.moderator_fallbacks:
            parts.append(f"{self.moderator_fallbacks} moderator fallbacks")
        limited = rate_limit_note(self.rate_limits)
        if limited:
            parts.append(limited)
        if self.stopped:
            parts.append(f"STOPPED: {self.stopped}")
        if self.failed:
            parts.append(f"FAILED: {self.failed}")
        return "; ".join(parts)


class ProgressLines:
    """Periodic one-line progress reports for runs whose output is not a terminal."""

    def __init__(self, *, enabled: bool, every_s: float = 30.0) -> None:
        self.enabled = enabled
        self.every_s = every_s
        self._last = time.monotonic()

    def tick(self, summary: RunSummary, caller: Caller) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < self.every_s:
            return
        self._last = now
        paced = pacing_note(caller.rate_limit_report())
        print(f"[spasm] {summary.completed:,}/{summary.planned:,} dialogues, "
              f"{summary.errors} quarantined, {caller.usage.total_tokens:,} tokens, "
              f"cost {caller.usage.cost:.4f}{'; ' + paced if paced else ''}",
              file=sys.stderr, flush=True)


def _rate(rps: float) -> str:
    return f"{rps:.1f} req/s" if rps >= 1 else f"{rps * 60:.1f} req/min"


def pacing_note(report: dict[str, dict[str, Any]]) -> str:
    """'srv paced at 36.0 req/s (after 429s)' for the backends paced now ('' when none)."""
    notes = []
    for name, r in sorted(report.items()):
        if not r.get("paced"):
            continue
        why = {"429s": "after 429s", "headers": "by its x-ratelimit headers"}.get(
            str(r.get("source")), "holding for a Retry-After")
        rate = r.get("rate_rps")
        notes.append(f"{name} paced at {_rate(rate)} ({why})" if isinstance(rate, int | float)
                     else f"{name} paced ({why})")
    return ", ".join(notes)


def rate_limit_note(report: dict[str, dict[str, Any]]) -> str:
    """'429s: srv 412, paced 9.8 s, calls waited 31.0 s after them' for the backends answered
    429 or held by pacing ('' when none)."""
    parts = []
    for name, r in sorted(report.items()):
        n = int(r.get("rate_limited") or 0)
        held = float(r.get("held_s") or 0)
        if not n and held < 0.05:
            continue
        text = f"{name} {n:,}"
        if r.get("state") == "overloaded":
            text += " (random: not about the rate)"
        if held >= 0.05:
            text += f", paced {held:.1f} s"
        retry = float(r.get("retry_wait_s") or 0)
        if retry >= 0.05:
            text += f", calls waited {retry:.1f} s after them"
        parts.append(text)
    return ("429s: " + "; ".join(parts)) if parts else ""


def progress_lines(*, enabled: bool) -> ProgressLines:
    """Periodic progress lines (on only when output is not a terminal)."""
    return ProgressLines(enabled=enabled)


def manifest_record(
    summary: RunSummary, caller: Caller, config: RunConfig, *, status: str, started: str,
    shard: dict[str, Any] | None, tables: tuple[str, ...],
) -> dict[str, Any]:
    """What manifest.json says of a run (or one pass of it)."""
    return {
        "spasm_version": installed_version("spasm") or "not installed",
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "name": config.name,
        "seed": config.seed,
        "shard": shard,
        "started_at": started,
        "updated_at": datetime.now(UTC).isoformat(),
        "counts": {
            "planned": summary.planned,
            "completed": summary.completed,
            "new_this_pass": summary.new,
            "quarantined_this_pass": summary.errors,
            "terminations_this_pass": dict(summary.terminations),
            "errors_this_pass": dict(summary.error_types),
            "harness_fallbacks_this_pass": summary.harness_fallbacks,
            "harness_fallbacks_by_level": dict(summary.level_fallbacks),
            "goal_unjudged_this_pass": summary.goal_unjudged,
            "moderator_fallbacks_this_pass": summary.moderator_fallbacks,
        },
        "structured_output": {
            name: {"configured": caller.configs[name].structured_output,
                   "mode": b.structured_mode, "rejected": b.structured_steps}
            for name, b in caller.backends.items()
        },
        "usage": {
            "by_role": caller.usage.by_role(),
            "total_tokens": caller.usage.total_tokens,
            "cost": caller.usage.cost,
            "cache_hits": caller.usage.cache_hits,
            "call_outcomes": dict(caller.usage.outcomes),
            **caller.usage.typed(),
        },
        "timing": {"elapsed_s": summary.elapsed_s},
        "rate_limits": caller.rate_limit_report(),
        "stopped": summary.stopped,
        "failed": summary.failed,
        "versions": {
            "python": platform.python_version(),
            **{p: installed_version(p) or "not installed"
               for p in ("openai", "pyarrow", "pydantic", "llama-cpp-python")},
        },
        "token_counter": counter_source(),
        # Every plugin this process loaded (what it registered may have made the rows).
        "plugins": plugin_records(),
        "tables": list(tables),
    }
