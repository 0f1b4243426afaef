"""The per-level harness report: what each ablation level buys and what it costs.

:func:`level_report` reads a run directory and writes ``harness_report.json`` and
``harness_report.md`` into it. Per harness level, ``metrics`` holds every metric of the
design's evaluation with a 95% bootstrap interval over dialogues (:mod:`spasm.harness.level_metrics`
defines them): boundary-violation rate, decision consistency in similar situations, state
continuity (jumps, clips, step violations), style similarity to the persona's policy and
first-vs-second-half style consistency, long-range fact recall (pooled, out of the window, and
by probe depth in ``recall_by_depth``), latency and tokens per turn, tokens per dialogue raw and
cache-adjusted, and the share of turns with a harness fallback. A metric a level does not have
is ``null`` in the JSON and "n/a" in the table. Next to them the level keeps its descriptive
counts (calls per role, fail/rewrite/flag rates, …).

Token accounting: the measurement roles ``audit`` and ``probe`` are reported apart (they
exist only to produce this report), and so is ``policy`` (extracted once per persona per run,
whichever dialogue happened to trigger it). Everything else — the agents' own calls,
``rewrite``, ``reducer``, ``context``, ``checker`` and the termination judge — is the cost of a
level. Level ratios are paired: same persona, conversation, pairing and condition. The
cache-adjusted cost uses the prompt tokens the API reported as cached (``calls.cached_tokens``)
when any call reports some, else spasm's prefix estimate; ``cost_source`` says which.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from spasm.dataset import open_run
from spasm.dataset.columns import CheckerVerdict, load_probes, load_state, load_verdict
from spasm.dataset.files import atomic_write_text
from spasm.errors import UserError
from spasm.harness.level_metrics import (
    DEFINITIONS,
    MEASUREMENT_ROLES,
    ONE_OFF_ROLES,
    RESAMPLES,
    dialogue_metrics,
    level_estimates,
    recall_by_depth,
    style_consistency,
)
from spasm.harness.retrieval import dominant_emotion

__all__ = ["MEASUREMENT_ROLES", "ONE_OFF_ROLES", "level_report", "style_consistency"]

_PAIR_KEYS = ["persona_id", "conversation_index", "pairing", "condition"]
#: The turns columns the report reads (``messages``, the largest, is not one of them).
_TURN_COLUMNS = ["dialogue_id", "turn_index", "speaker", "text", "checker_verdict", "flagged",
                 "intent", "state", "state_clips", "state_log", "harness_fallbacks",
                 "cached_prompt_tokens", "probe"]


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


@dataclass(frozen=True)
class _Checked:
    """One turn's verdict with the situation it was given in (for the failure breakdown)."""

    verdict: CheckerVerdict
    intent: str | None
    #: The speaker's dominant emotion after the turn (``None``: no state stored).
    emotion: str | None


def _verdicts(turns: pd.DataFrame) -> list[_Checked]:
    out = []
    for raw, intent, raw_state in zip(turns.checker_verdict, turns.intent, turns.state,
                                      strict=True):
        verdict = load_verdict(raw)
        if verdict is None:
            continue
        state = load_state(raw_state)
        out.append(_Checked(verdict, intent if isinstance(intent, str) else None,
                            dominant_emotion(state) if state is not None else None))
    return out


def _level_counts(
    level: str, dialogues: pd.DataFrame, turns: pd.DataFrame, calls: pd.DataFrame,
    adjusted: pd.Series,
) -> dict[str, Any]:
    """A level's descriptive figures (point values; the metrics with intervals come apart)."""
    ids = set(dialogues.dialogue_id)
    t = turns[turns.dialogue_id.isin(ids)]
    c = calls[calls.dialogue_id.isin(ids)]
    n_dialogues = max(len(ids), 1)
    per_turn = max(len(t), 1)
    cost = c[~c.role.isin(MEASUREMENT_ROLES | ONE_OFF_ROLES)]
    tokens = int(cost.prompt_tokens.sum() + cost.completion_tokens.sum())
    api_cached = int(cost.cached_tokens.fillna(0).sum()) if "cached_tokens" in cost else 0
    checked = _verdicts(t)
    verdicts = [c.verdict for c in checked]
    decided = [v for v in verdicts if v.passed is not None]
    verified = [v for v in verdicts if v.mode == "verify" and v.checks]
    first_fail = [v for v in verified if v.checks and not v.checks[0].passed]
    state_turns = t[t.state.notna()]
    recalls: dict[str, list[float]] = {"client": [], "responder": []}
    out_of_window: list[bool] = []
    for speaker, raw in zip(t.speaker, t.probe, strict=True):
        for p in load_probes(raw):
            if p.recall is not None:
                recalls[speaker].append(p.recall)
                out_of_window.append(p.in_window is False)
    return {
        "level": level,
        "dialogues": len(ids),
        "utterances_per_dialogue": _mean(list(dialogues.n_utterances.astype(float))),
        "calls_per_turn": round(len(cost) / per_turn, 3),
        "calls_per_turn_by_role": {
            r: round(int(n) / per_turn, 3) for r, n in c.groupby("role").size().items()
        },
        "prompt_tokens_per_turn": round(float(cost.prompt_tokens.sum()) / per_turn, 1),
        "completion_tokens_per_turn": round(float(cost.completion_tokens.sum()) / per_turn, 1),
        "tokens_per_turn": round(tokens / per_turn, 1),
        "tokens_per_dialogue": round(tokens / n_dialogues, 1),
        "cached_prompt_tokens_per_dialogue": round(
            float(t.cached_prompt_tokens.fillna(0).sum()) / n_dialogues, 1),
        "api_cached_tokens_per_dialogue": round(api_cached / n_dialogues, 1),
        "cache_adjusted_tokens_per_dialogue": round(
            float(adjusted.reindex(list(ids)).fillna(0).sum()) / n_dialogues, 1),
        "latency_s_per_turn": round(float(cost.latency_s.sum()) / per_turn, 4),
        "measurement_tokens_per_dialogue": round(
            float(c[c.role.isin(MEASUREMENT_ROLES)][["prompt_tokens", "completion_tokens"]]
                  .to_numpy().sum()) / n_dialogues, 1),
        "one_off_policy_tokens": int(
            c[c.role.isin(ONE_OFF_ROLES)][["prompt_tokens", "completion_tokens"]].to_numpy().sum()
        ),
        "checked_turns": sum(1 for v in verdicts if v.passed is not None or v.fallback),
        "boundary_violation_rate": _rate(sum(bool(v.boundary_violation) for v in decided),
                                         len(decided)),
        "check_fail_rate": _rate(sum(1 for v in decided if not v.passed), len(decided)),
        "first_check_fail_rate": _rate(len(first_fail), len(verified)),
        "rewrite_rate": _rate(sum(1 for v in verdicts if v.rewritten), len(t)),
        "flagged_rate": _rate(int(t.flagged.fillna(False).astype(bool).sum()), len(t)),
        "state_turns": len(state_turns),
        "state_clip_turn_share": _rate(int((state_turns.state_clips > 0).sum()), len(state_turns)),
        "state_clips_per_turn": round(float(state_turns.state_clips.mean()), 3)
        if len(state_turns) else None,
        "harness_fallbacks": int(t.harness_fallbacks.fillna(0).sum()),
        "recall_responder": _mean(recalls["responder"]),
        "recall_client": _mean(recalls["client"]),
        "recall_out_of_window_share": _rate(sum(out_of_window), len(out_of_window)),
        "_verdicts": checked,
    }


def _ratios(dialogues: pd.DataFrame, calls: pd.DataFrame, adjusted: pd.Series) -> dict[str, Any]:
    cost = calls[~calls.role.isin(MEASUREMENT_ROLES | ONE_OFF_ROLES)]
    tokens = (cost.prompt_tokens + cost.completion_tokens).groupby(cost.dialogue_id).sum()
    d = dialogues.set_index("dialogue_id")
    d = d.assign(tokens=tokens.reindex(d.index).fillna(0),
                 adjusted=adjusted.reindex(d.index).fillna(0))
    base = d[d.harness_level == "A"].reset_index().set_index(_PAIR_KEYS)
    out: dict[str, Any] = {}
    for level in sorted(set(d.harness_level) - {"A"}):
        other = d[d.harness_level == level].reset_index().set_index(_PAIR_KEYS)
        joined = base.merge(other, left_index=True, right_index=True, suffixes=("_a", "_x"))
        joined = joined[joined.tokens_a > 0]
        if joined.empty:
            continue
        per_utt_a = joined.tokens_a / joined.n_utterances_a
        per_utt_x = joined.tokens_x / joined.n_utterances_x
        out[level] = {
            "pairs": len(joined),
            "ratio_of_sums": round(float(joined.tokens_x.sum() / joined.tokens_a.sum()), 3),
            "mean_paired_ratio": round(float((joined.tokens_x / joined.tokens_a).mean()), 3),
            "per_utterance_ratio": round(float(per_utt_x.sum() / per_utt_a.sum()), 3),
            "cache_adjusted_ratio": round(
                float(joined.adjusted_x.sum() / joined.adjusted_a.sum()), 3
            ) if joined.adjusted_a.sum() else None,
            "same_length_pairs": int((joined.n_utterances_a == joined.n_utterances_x).sum()),
        }
    return out


_GENERATION = frozenset({"client", "responder"})
_BEFORE_REPLY = frozenset({"reducer", "context"})


def _cumulative_tokens(calls: pd.DataFrame) -> list[int]:
    """Tokens spent up to and including each utterance of one dialogue (its calls in order).

    Reducer and context calls belong to the utterance they prepare, checks and rewrites to the
    one they judge; a generation call that succeeded opens a new utterance.
    """
    per_utt: list[int] = []
    pending = 0
    ordered = calls.assign(
        seq=calls.call_id.str.rsplit("#", n=1).str[-1].astype(int),
        tokens=calls.prompt_tokens + calls.completion_tokens,
    ).sort_values("seq")
    for role, outcome, tokens in zip(ordered.role, ordered.outcome, ordered.tokens, strict=True):
        if role in MEASUREMENT_ROLES | ONE_OFF_ROLES:
            continue
        if role in _GENERATION and outcome in ("ok", "cache_hit"):
            per_utt.append(pending + int(tokens))
            pending = 0
        elif role in _BEFORE_REPLY or not per_utt:
            pending += int(tokens)
        else:
            per_utt[-1] += int(tokens)
    out, total = [], 0
    for t in per_utt:
        total += t
        out.append(total)
    return out


def _ratio_by_length(dialogues: pd.DataFrame, calls: pd.DataFrame) -> dict[str, Any]:
    """Paired token ratios versus level A over the first N utterances of each dialogue: how the
    overhead changes with dialogue length, from one run of long dialogues."""
    curves = {did: _cumulative_tokens(g) for did, g in calls.groupby("dialogue_id")}
    d = dialogues.set_index(_PAIR_KEYS)
    base = d[d.harness_level == "A"]
    out: dict[str, Any] = {}
    for level in sorted(set(d.harness_level) - {"A"}):
        other = d[d.harness_level == level]
        pairs = [
            (curves.get(base.loc[k, "dialogue_id"], []), curves.get(other.loc[k, "dialogue_id"], []))
            for k in base.index.intersection(other.index)
        ]
        longest = min((min(len(a), len(b)) for a, b in pairs), default=0)
        marks = sorted({n for n in (10, 20, 30, 40, 50, 60, 80, 100) if n <= longest} | (
            {longest} if longest else set()))
        out[level] = {
            str(n): round(sum(b[n - 1] for _, b in pairs) / sum(a[n - 1] for a, _ in pairs), 3)
            for n in marks if sum(a[n - 1] for a, _ in pairs)
        }
    return out


def _failures(checked: list[_Checked]) -> dict[str, Any]:
    violations: Counter[str] = Counter()
    by_intent: dict[str, list[int]] = {}
    by_emotion: dict[str, list[int]] = {}
    for c in checked:
        if c.verdict.passed is None:
            continue
        failed = int(not c.verdict.passed)
        for x in c.verdict.violations or []:
            violations[x.lower()[:80]] += 1
        if c.intent:
            by_intent.setdefault(c.intent, []).append(failed)
        if c.emotion:
            by_emotion.setdefault(c.emotion, []).append(failed)
    return {
        "top_violations": violations.most_common(10),
        "fail_rate_by_intent": {k: round(sum(x) / len(x), 3) for k, x in sorted(by_intent.items())},
        "fail_rate_by_emotion": {
            k: round(sum(x) / len(x), 3) for k, x in sorted(by_emotion.items())
        },
    }


_COLUMNS = [
    ("dialogues", "dialogues"),
    ("utterances_per_dialogue", "utterances/dlg"),
    ("calls_per_turn", "calls/turn"),
    ("checked_turns", "checked"),
    ("check_fail_rate", "check fail"),
    ("rewrite_rate", "rewritten"),
    ("flagged_rate", "flagged"),
    ("state_turns", "state turns"),
    ("harness_fallbacks", "fallbacks"),
]
#: The metrics table's rows, in the design's order.
_METRIC_ROWS = [
    ("boundary_violation_rate", "boundary-violation rate"),
    ("decision_consistency", "decision consistency"),
    ("state_jump_rate", "state: turns with a jump"),
    ("state_clip_rate", "state: turns clipped"),
    ("state_clips_per_turn", "state: clips/turn"),
    ("state_step_violation_rate", "state: steps over the limit"),
    ("style_similarity", "style similarity (Client)"),
    ("style_consistency", "style consistency"),
    ("recall", "fact recall (all depths)"),
    ("recall_out_of_window", "fact recall, out of window"),
    ("latency_s_per_turn", "latency s/turn"),
    ("tokens_per_turn", "tokens/turn"),
    ("tokens_per_dialogue", "tokens/dialogue"),
    ("cache_adjusted_tokens_per_dialogue", "cache-adjusted tokens/dialogue"),
    ("fallback_turn_share", "turns with a fallback"),
    ("fallbacks_per_turn", "fallbacks/turn"),
]


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _fmt_ci(e: dict[str, Any] | None) -> str:
    if e is None:
        return "n/a"
    lo, hi = e["ci95"]
    return f"{_fmt(float(e['value']))} [{_fmt(float(lo))}, {_fmt(float(hi))}]"


def _metrics_table(levels: dict[str, Any]) -> list[str]:
    names = list(levels)
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, label in _METRIC_ROWS:
        lines.append(f"| {label} | " + " | ".join(
            _fmt_ci(levels[n]["metrics"].get(key)) for n in names) + " |")
    depths = sorted({d for m in levels.values() for d in m["recall_by_depth"]}, key=float)
    for depth in depths:
        cells = []
        for n in names:
            at = levels[n]["recall_by_depth"].get(depth)
            cells.append("n/a" if at is None else
                         f"{_fmt_ci(at['recall'])} ({at['probes']}, {_fmt(at['mean_distance'])})")
        lines.append(f"| fact recall, depth {depth} (probes, distance) | " + " | ".join(cells) + " |")
    return lines


def _markdown(report: dict[str, Any]) -> str:
    levels = report["levels"]
    lines = ["# Persona Harness report", "", f"Run: `{report['run_dir']}`", "",
             "## Metrics per level", "", report["ci_method"], ""]
    lines += _metrics_table(levels)
    lines += ["", f"Cache-adjusted cost: {report['cost_source_note']}", "",
              "## Counts per level", ""]
    lines.append("| level | " + " | ".join(h for _, h in _COLUMNS) + " |")
    lines.append("|---" * (len(_COLUMNS) + 1) + "|")
    for name, m in levels.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(k)) for k, _ in _COLUMNS) + " |")
    if report["token_ratio_vs_A"]:
        lines += ["", "## Tokens versus level A (paired dialogues)", "",
                  "| level | pairs | ratio of sums | mean paired | per utterance | cache-adjusted |",
                  "|---|---|---|---|---|---|"]
        for name, r in report["token_ratio_vs_A"].items():
            lines.append(
                f"| {name} | {r['pairs']} | {_fmt(r['ratio_of_sums'])} | "
                f"{_fmt(r['mean_paired_ratio'])} | {_fmt(r['per_utterance_ratio'])} | "
                f"{_fmt(r['cache_adjusted_ratio'])} |"
            )
    by_length = {k: v for k, v in report["token_ratio_by_length"].items() if v}
    if by_length:
        lines += ["", "Ratio of tokens over the first N utterances (paired, versus A):", ""]
        for name, curve in by_length.items():
            lines.append(f"- {name}: " + ", ".join(f"N={n}: {r:.2f}" for n, r in curve.items()))
    f = report["failures"]
    if f["top_violations"]:
        lines += ["", "## What the checker caught", ""]
        lines += [f"- {n}× {text}" for text, n in f["top_violations"]]
    if f["fail_rate_by_intent"]:
        lines += ["", "Fail rate by intent: " + ", ".join(
            f"{k} {v:.2f}" for k, v in f["fail_rate_by_intent"].items())]
    if f["fail_rate_by_emotion"]:
        lines += ["", "Fail rate by dominant emotion: " + ", ".join(
            f"{k} {v:.2f}" for k, v in f["fail_rate_by_emotion"].items())]
    lines += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in report["definitions"].items()]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def _tables(run: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None,
                                dict[str, Any] | None]:
    """dialogues, turns (the columns the report reads), calls, personas and the run config."""
    opened = open_run(run)
    if not all(opened.has(t) for t in ("dialogues", "turns", "calls")):
        raise UserError(f"{run} has no completed dialogues to report on (run `spasm generate`).")
    dialogues = opened.df("dialogues")
    if dialogues.empty:
        raise UserError(f"{run} has no completed dialogues to report on (run `spasm generate`).")
    if "harness_level" not in dialogues:
        raise UserError(f"{run} was written before the harness existed (no harness_level column).")
    turns = opened.df("turns", columns=_TURN_COLUMNS)
    for col, default in (("cached_prompt_tokens", 0), ("state", None), ("state_clips", 0),
                         ("state_log", None), ("harness_fallbacks", 0), ("probe", None),
                         ("intent", None), ("checker_verdict", None), ("flagged", False)):
        if col not in turns:
            turns[col] = default
    calls = opened.df("calls")
    if "cached_tokens" not in opened.stored_columns("calls"):
        # Written before calls reported cached tokens: no API figure, whatever a reader fills in.
        calls = calls.drop(columns=["cached_tokens"], errors="ignore")
    personas = opened.df("personas") if opened.has("personas") else None
    return dialogues, turns, calls, personas, opened.config


def _cost_note(source: str, cache_discount: float) -> str:
    if source == "api":
        return ("prompt tokens the API reported as cached (calls.cached_tokens), at each "
                "backend's cached input price relative to its input price (prices), or at "
                f"{1 - cache_discount:.0%} for a backend without prices.")
    return ("no call reported cached tokens, so spasm's estimate (turns.cached_prompt_tokens: "
            "prompt tokens an exact-prefix cache could serve within the dialogue, no provider "
            f"minimum) is billed at {1 - cache_discount:.0%} of an input token.")


def level_report(run_dir: str | Path, *, cache_discount: float = 0.5) -> dict[str, Any]:
    """Compute the per-level report of a run and write ``harness_report.{json,md}`` into it.

    ``cache_discount`` is the share of a cached prompt token's price a provider waives (0.5
    for OpenAI; 0.9 for providers that bill cache hits at a tenth); it prices the estimate,
    and API-reported cached tokens of a backend whose config sets no prices.
    """
    run = Path(run_dir)
    dialogues, turns, calls, personas, config = _tables(run)
    per_dialogue, probes, source = dialogue_metrics(dialogues, turns, calls, personas, config,
                                                    cache_discount)
    adjusted = per_dialogue["cache_adjusted_tokens_per_dialogue__num"]
    levels: dict[str, Any] = {}
    verdicts: list[_Checked] = []
    for level in sorted(set(dialogues.harness_level.astype(str))):
        d = dialogues[dialogues.harness_level.astype(str) == level]
        m = _level_counts(level, d, turns, calls, adjusted)
        verdicts += m.pop("_verdicts")
        m["metrics"] = level_estimates(per_dialogue.loc[list(d.dialogue_id)])
        m["recall_by_depth"] = recall_by_depth(list(d.dialogue_id), probes)
        levels[level] = m
    report: dict[str, Any] = {
        "run_dir": str(run),
        "cache_discount": cache_discount,
        "cost_source": source,
        "cost_source_note": _cost_note(source, cache_discount),
        "ci_method": f"Value: the pooled ratio over a level's dialogues; [95% interval]: "
        f"percentile bootstrap over dialogues ({RESAMPLES} resamples, fixed seed). n/a: the "
        "level does not have the metric.",
        "levels": levels,
        "token_ratio_vs_A": _ratios(dialogues, calls, adjusted),
        "token_ratio_by_length": _ratio_by_length(dialogues, calls),
        "failures": _failures(verdicts),
        "definitions": DEFINITIONS,
        "notes": [
            "Tokens exclude the measurement roles (audit, probe) and the one-off policy "
            "extraction; they include every call a level makes to produce its dialogue.",
            "Boundary violations come from the checker (level E) or the audit checker (other "
            "levels, harness.audit); without either the rate is n/a.",
            "Recall: share of the probed partner message's first content words an agent "
            "recalls after the dialogue (harness.recall_probe, at harness.probe_depths); "
            "distance: utterances said after the probed message.",
        ],
    }
    atomic_write_text(run / "harness_report.json",
                      json.dumps(report, indent=2, default=str, ensure_ascii=False) + "\n")
    atomic_write_text(run / "harness_report.md", _markdown(report))
    return report
