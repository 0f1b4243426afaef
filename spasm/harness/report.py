"""The per-level harness report: what each ablation level buys and what it costs.

:func:`level_report` reads a run directory and writes ``harness_report.json`` and
``harness_report.md`` into it. Per harness level:

* **boundary-violation rate** — share of checked replies (level E's checker, or the ``audit``
  checker at lower levels) whose *accepted* version breached a boundary; plus fail, rewrite
  and flag rates;
* **state continuity** — share of turns where the reducer's hard constraints had to clip a
  value the model proposed (lower is smoother), and clips per turn;
* **long-range fact recall** — the probe's score (see :mod:`spasm.harness.probe`);
* **style consistency** — cosine of function-word profiles, first vs second half of each
  agent's turns;
* **calls, tokens and latency per turn**, and tokens per dialogue, with the cache estimate.

Token accounting: the measurement roles ``audit`` and ``probe`` are reported apart (they
exist only to produce this report), and so is ``policy`` (extracted once per persona per run,
whichever dialogue happened to trigger it). Everything else — the agents' own calls,
``rewrite``, ``reducer``, ``context``, ``checker`` and the termination judge — is the cost of a
level. Level ratios are paired: same persona, conversation, pairing and condition.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from spasm.dataset import open_run
from spasm.dataset.files import atomic_write_text
from spasm.errors import UserError

__all__ = ["MEASUREMENT_ROLES", "ONE_OFF_ROLES", "level_report", "style_consistency"]

MEASUREMENT_ROLES = frozenset({"audit", "probe"})
ONE_OFF_ROLES = frozenset({"policy"})
_PAIR_KEYS = ["persona_id", "conversation_index", "pairing", "condition"]
_FUNCTION_WORDS = (
    "i", "me", "my", "you", "your", "we", "it", "is", "am", "are", "was", "the", "a", "an", "and",
    "but", "so", "or", "because", "if", "then", "just", "really", "very", "not", "no", "yes", "please",
    "thanks", "thank", "sorry", "well", "oh", "okay", "maybe", "actually", "also", "that", "this",
    "what", "how", "why", "when", "can", "could", "would", "should", "will", "do", "does", "did",
    "have", "has", "had",
)


def _read(run_dir: Path, table: str) -> pd.DataFrame | None:
    run = open_run(run_dir)
    return run.df(table) if run.has(table) else None


def _profile(texts: list[str]) -> list[float]:
    words = " ".join(texts).lower().replace("?", " ? ").replace("!", " ! ").split()
    counts = Counter(words)
    return [float(counts[w]) for w in (*_FUNCTION_WORDS, "?", "!")]


def _cosine(a: list[float], b: list[float]) -> float | None:
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    if not na or not nb:
        return None
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def style_consistency(texts: list[str]) -> float | None:
    """Cosine between the function-word profiles of the first and second half of ``texts``."""
    if len(texts) < 4:
        return None
    half = len(texts) // 2
    return _cosine(_profile(texts[:half]), _profile(texts[half:]))


def _mean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return round(sum(vals) / len(vals), 4) if vals else None


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _verdicts(turns: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for raw, intent, state in zip(turns.checker_verdict, turns.intent, turns.state, strict=True):
        if not isinstance(raw, str):
            continue
        v = json.loads(raw)
        v["_intent"] = intent if isinstance(intent, str) else None
        if isinstance(state, str):
            emotions = json.loads(state).get("emotions", {})
            top = max(emotions, key=emotions.get) if emotions else None
            v["_emotion"] = top if top and emotions[top] >= 60 else "neutral"
        else:
            v["_emotion"] = None
        out.append(v)
    return out


def _level_metrics(
    level: str, dialogues: pd.DataFrame, turns: pd.DataFrame, calls: pd.DataFrame,
    cache_discount: float,
) -> dict[str, Any]:
    ids = set(dialogues.dialogue_id)
    t = turns[turns.dialogue_id.isin(ids)]
    c = calls[calls.dialogue_id.isin(ids)]
    n_dialogues = len(ids)
    n_turns = len(t)
    cost = c[~c.role.isin(MEASUREMENT_ROLES | ONE_OFF_ROLES)]
    prompt = int(cost.prompt_tokens.sum())
    completion = int(cost.completion_tokens.sum())
    cached = int(t.cached_prompt_tokens.fillna(0).sum()) if "cached_prompt_tokens" in t else 0
    verdicts = _verdicts(t) if "checker_verdict" in t else []
    checked = [v for v in verdicts if v.get("pass") is not None or v.get("fallback")]
    decided = [v for v in verdicts if v.get("pass") is not None]
    boundary = [v for v in decided if v.get("boundary_violation")]
    first_fail = [v for v in verdicts if v.get("mode") == "verify" and v.get("checks")
                  and not v["checks"][0]["pass"]]
    state_turns = t[t.state.notna()] if "state" in t else t.iloc[0:0]
    recalls: dict[str, list[float]] = {"client": [], "responder": []}
    out_of_window: list[bool] = []
    for speaker, raw in zip(t.speaker, t.probe if "probe" in t else [], strict=False):
        if isinstance(raw, str):
            p = json.loads(raw)
            if p.get("recall") is not None:
                recalls[speaker].append(p["recall"])
                out_of_window.append(not p.get("in_window", True))
    styles = []
    for _, g in t.sort_values(["dialogue_id", "turn_index"]).groupby(["dialogue_id", "speaker"]):
        s = style_consistency(list(g.text))
        if s is not None:
            styles.append(s)
    per_turn = max(n_turns, 1)
    return {
        "level": level,
        "dialogues": n_dialogues,
        "utterances_per_dialogue": _mean(list(dialogues.n_utterances.astype(float))),
        "calls_per_turn": round(len(cost) / per_turn, 3),
        "calls_per_turn_by_role": {
            r: round(int(n) / per_turn, 3) for r, n in c.groupby("role").size().items()
        },
        "prompt_tokens_per_turn": round(prompt / per_turn, 1),
        "completion_tokens_per_turn": round(completion / per_turn, 1),
        "tokens_per_turn": round((prompt + completion) / per_turn, 1),
        "tokens_per_dialogue": round((prompt + completion) / max(n_dialogues, 1), 1),
        "cached_prompt_tokens_per_dialogue": round(cached / max(n_dialogues, 1), 1),
        "cache_adjusted_tokens_per_dialogue": round(
            (prompt + completion - cache_discount * cached) / max(n_dialogues, 1), 1
        ),
        "latency_s_per_turn": round(float(cost.latency_s.sum()) / per_turn, 4),
        "measurement_tokens_per_dialogue": round(
            float(c[c.role.isin(MEASUREMENT_ROLES)][["prompt_tokens", "completion_tokens"]]
                  .to_numpy().sum()) / max(n_dialogues, 1), 1),
        "one_off_policy_tokens": int(
            c[c.role.isin(ONE_OFF_ROLES)][["prompt_tokens", "completion_tokens"]].to_numpy().sum()
        ),
        "checked_turns": len(checked),
        "boundary_violation_rate": _rate(len(boundary), len(decided)),
        "check_fail_rate": _rate(sum(1 for v in decided if not v["pass"]), len(decided)),
        "first_check_fail_rate": _rate(len(first_fail), sum(
            1 for v in verdicts if v.get("mode") == "verify" and v.get("checks"))),
        "rewrite_rate": _rate(sum(1 for v in verdicts if v.get("rewritten")), n_turns),
        "flagged_rate": _rate(int(t.flagged.fillna(False).astype(bool).sum()), n_turns),
        "state_turns": len(state_turns),
        "state_clip_turn_share": _rate(int((state_turns.state_clips > 0).sum()), len(state_turns)),
        "state_clips_per_turn": round(float(state_turns.state_clips.mean()), 3)
        if len(state_turns) else None,
        "harness_fallbacks": int(t.harness_fallbacks.fillna(0).sum())
        if "harness_fallbacks" in t else 0,
        "fallbacks_per_turn": round(float(t.harness_fallbacks.fillna(0).sum()) / per_turn, 4)
        if "harness_fallbacks" in t else 0.0,
        "recall_responder": _mean(recalls["responder"]),
        "recall_client": _mean(recalls["client"]),
        "recall_out_of_window_share": _rate(sum(out_of_window), len(out_of_window)),
        "style_consistency": _mean(styles),
        "_verdicts": verdicts,
    }


def _ratios(dialogues: pd.DataFrame, calls: pd.DataFrame, turns: pd.DataFrame,
            cache_discount: float) -> dict[str, Any]:
    cost = calls[~calls.role.isin(MEASUREMENT_ROLES | ONE_OFF_ROLES)]
    tokens = (cost.prompt_tokens + cost.completion_tokens).groupby(cost.dialogue_id).sum()
    cached = turns.groupby("dialogue_id").cached_prompt_tokens.sum() \
        if "cached_prompt_tokens" in turns else pd.Series(dtype=float)
    d = dialogues.set_index("dialogue_id")
    d = d.assign(tokens=tokens.reindex(d.index).fillna(0),
                 cached=cached.reindex(d.index).fillna(0))
    d["adjusted"] = d.tokens - cache_discount * d.cached
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


def _failures(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    violations: Counter[str] = Counter()
    by_intent: dict[str, list[int]] = {}
    by_emotion: dict[str, list[int]] = {}
    for v in verdicts:
        if v.get("pass") is None:
            continue
        failed = int(not v["pass"])
        for x in v.get("violations") or []:
            violations[x.lower()[:80]] += 1
        if v.get("_intent"):
            by_intent.setdefault(v["_intent"], []).append(failed)
        if v.get("_emotion"):
            by_emotion.setdefault(v["_emotion"], []).append(failed)
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
    ("tokens_per_turn", "tokens/turn"),
    ("tokens_per_dialogue", "tokens/dlg"),
    ("cache_adjusted_tokens_per_dialogue", "cache-adj. tokens/dlg"),
    ("latency_s_per_turn", "latency s/turn"),
    ("boundary_violation_rate", "boundary viol."),
    ("flagged_rate", "flagged"),
    ("state_clip_turn_share", "turns clipped"),
    ("recall_responder", "recall (resp.)"),
    ("recall_client", "recall (client)"),
    ("style_consistency", "style cons."),
    ("fallbacks_per_turn", "fallbacks/turn"),
]


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _markdown(report: dict[str, Any]) -> str:
    levels = report["levels"]
    lines = ["# Persona Harness report", "", f"Run: `{report['run_dir']}`", ""]
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
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def level_report(run_dir: str | Path, *, cache_discount: float = 0.5) -> dict[str, Any]:
    """Compute the per-level report of a run and write ``harness_report.{json,md}`` into it.

    ``cache_discount`` is the share of a cached prompt token's price a provider waives (0.5
    for OpenAI; 0.9 for providers that bill cache hits at a tenth).
    """
    run = Path(run_dir)
    dialogues, turns, calls = (_read(run, t) for t in ("dialogues", "turns", "calls"))
    if dialogues is None or turns is None or calls is None or dialogues.empty:
        raise UserError(f"{run} has no completed dialogues to report on (run `spasm generate`).")
    if "harness_level" not in dialogues:
        raise UserError(f"{run} was written before the harness existed (no harness_level column).")
    for col, default in (("cached_prompt_tokens", 0), ("state", None), ("state_clips", 0),
                         ("harness_fallbacks", 0), ("probe", None), ("intent", None)):
        if col not in turns:
            turns[col] = default
    levels: dict[str, Any] = {}
    verdicts: list[dict[str, Any]] = []
    for level in sorted(set(dialogues.harness_level)):
        d = dialogues[dialogues.harness_level == level]
        m = _level_metrics(level, d, turns, calls, cache_discount)
        verdicts += m.pop("_verdicts")
        levels[level] = m
    report: dict[str, Any] = {
        "run_dir": str(run),
        "cache_discount": cache_discount,
        "levels": levels,
        "token_ratio_vs_A": _ratios(dialogues, calls, turns, cache_discount),
        "token_ratio_by_length": _ratio_by_length(dialogues, calls),
        "failures": _failures(verdicts),
        "notes": [
            "Tokens exclude the measurement roles (audit, probe) and the one-off policy "
            "extraction; they include every call a level makes to produce its dialogue.",
            "cached_prompt_tokens is an estimate of prompt tokens an exact-prefix cache could "
            "serve within the dialogue (no provider minimum; OpenAI caches only prompts of "
            f"1,024+ tokens); cache-adjusted tokens bill them at {1 - cache_discount:.0%}.",
            "Boundary violations come from the checker (level E) or the audit checker (other "
            "levels, harness.audit); without either the rate is empty.",
            "Recall: share of the partner's opening content words an agent recalls after the "
            "dialogue (harness.recall_probe).",
        ],
    }
    atomic_write_text(run / "harness_report.json",
                      json.dumps(report, indent=2, default=str, ensure_ascii=False) + "\n")
    atomic_write_text(run / "harness_report.md", _markdown(report))
    return report
