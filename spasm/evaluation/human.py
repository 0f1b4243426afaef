"""Numbers calibrated against people: the simulator beside a human set, and the goal judge
beside what the person said (docs/evaluation.md, "Against people").

**Simulator vs people.** The human set is every dialogue with a person in a seat
(``dialogues.client_kind`` / ``responder_kind`` ``human``, format 1.10: ``spasm play``
sessions, ``spasm import`` of ShareGPT or OpenAI messages; in a group dialogue each seat's
``participants.kind``), in the run itself and in ``--reference``. A group dialogue's side is
``human`` when every seat of that role is a person's and a model's when none is; a side that
mixes people and models (:data:`MIXED`) is in neither set, and a note counts it. Each
realism metric of a side (``mattr_client``, ``hdd_responder`` …,
:data:`~spasm.evaluation.realism.REALISM_METRICS`) is compared where that side is a person
(human values) and where it is a model (simulated values: kind ``llm``, or no kind recorded,
as in every run before 1.10). The ceiling is the human–human spread: the human set split at
random into two halves, the absolute difference of the halves' means, averaged over
:data:`SPLITS` seeded splits (MirrorBench's human–human control). A simulator whose gap to the
people is within that spread is as close to them as two groups of people are to each other.

**Judge calibration.** A dialogue a person played ends with their own verdict
(``person_goal_met``, ``person_rating`` 1–5); where the goal judge also decided
(``goal_met``), Cohen's κ and the share of agreement say how well it matches the person, and
its bias is the rate it judges met minus the rate the person said met. Spearman's ρ relates the
rating to the judge's outcome (the reward where the run has one, else ``goal_met`` as 0/1).

Runs without people get no ``human`` section (:func:`human_stage` returns ``None``;
``test_a_run_without_people_has_no_human_section``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from spasm.errors import UserError
from spasm.evaluation.agreement import cohen_kappa
from spasm.evaluation.diagnostics import frustration_fraction, politeness_fraction
from spasm.evaluation.embeddings import FloatArray, l2_normalise
from spasm.evaluation.lexical import word_tokens
from spasm.evaluation.loader import (
    Conversation,
    RunData,
    clean_cell,
    load_reference,
    reference_paths,
    seat_role,
)
from spasm.evaluation.metrics import (
    ForkComparison,
    ForkExample,
    HumanMetrics,
    HumanRealismStat,
    JudgeCalibration,
)
from spasm.evaluation.realism import REALISM_METRICS, realism_frame
from spasm.evaluation.stats import finite, mean_ci

#: Texts -> their embeddings (the pipeline's cached embedder).
Embed = Callable[[list[str]], FloatArray]

__all__ = ["MIXED", "SPLITS", "fork_comparison", "human_frame", "human_stage", "judge_calibration",
           "summary_lines"]

#: The kind of a group dialogue's side whose seats are people and models both.
MIXED = "mixed"

#: Random half-splits of the human set averaged for the human–human spread.
SPLITS = 200
_SEED = 20260126
_MIN_SPLIT = 4  # two dialogues a half


def _side(metric: str) -> str:
    return metric.rsplit("_", 1)[1]


def _group_sides(run_dir: Path) -> dict[str, dict[str, str]]:
    """Each group dialogue's side kinds from its seats (``participants.kind``, format 1.10):
    the seats' one kind, or :data:`MIXED`; empty for a run without seat kinds."""
    from spasm.dataset.reader import open_run

    try:
        run = open_run(run_dir, verify=False)
    except UserError:
        return {}
    if not run.has("participants"):
        return {}
    stored = run.stored_columns("participants")
    if not {"dialogue_id", "kind"} <= set(stored):
        return {}
    columns: list[str] = [c for c in ("dialogue_id", "role", "persona_id", "kind") if c in stored]
    seen: dict[str, dict[str, set[str]]] = {}
    for r in run.df("participants", columns).to_dict("records"):
        did = clean_cell(r.get("dialogue_id"))
        if did is not None:
            side = seat_role(r.get("role"), clean_cell(r.get("persona_id")))
            seen.setdefault(did, {}).setdefault(side, set()).add(clean_cell(r.get("kind")) or "llm")
    return {did: {side: next(iter(k)) if len(k) == 1 else MIXED for side, k in sides.items()}
            for did, sides in seen.items()}


def _kinds(data: RunData) -> dict[str, dict[str, str]]:
    """Each dialogue's side kinds (``client``/``responder`` -> ``llm``/``function``/``human``,
    or :data:`MIXED`): a group dialogue's from its seats, a two-party one's from its row; a run
    without the 1.10 columns is models throughout."""
    groups = _group_sides(data.run_dir)
    out: dict[str, dict[str, str]] = {}
    for row in data.dialogues.to_dict("records"):
        kinds = {}
        for side in ("client", "responder"):
            value = row.get(f"{side}_kind")
            kinds[side] = str(value) if isinstance(value, str) and value else "llm"
        did = str(row["dialogue_id"])
        out[did] = {**kinds, **groups.get(did, {})}
    return out


def _mixed(kinds: dict[str, dict[str, str]]) -> int:
    return sum(MIXED in k.values() for k in kinds.values())


def _has_person(kinds: dict[str, dict[str, str]]) -> int:
    """Dialogues with a person in a seat (a mixed side has one too)."""
    return sum(bool({"human", MIXED} & set(k.values())) for k in kinds.values())


def human_frame(data: RunData) -> tuple[pd.DataFrame, dict[str, dict[str, str]]]:
    """A run's realism frame (one row per dialogue) and its seats' kinds."""
    return realism_frame(data.conversations), _kinds(data)


def _values(frame: pd.DataFrame, kinds: dict[str, dict[str, str]], metric: str, kind: str,
            ids: set[str] | None = None) -> np.ndarray:
    side = _side(metric)
    rows = [did for did in frame.index
            if kinds.get(str(did), {}).get(side) == kind and (ids is None or str(did) in ids)]
    values: np.ndarray = frame.loc[rows, metric].to_numpy(dtype=float) if rows else np.array([])
    kept: np.ndarray = values[np.isfinite(values)]
    return kept


def _spread(values: np.ndarray, rng: np.random.Generator) -> float | None:
    """The mean |difference of the two halves' means| over :data:`SPLITS` random halvings."""
    n = values.size
    if n < _MIN_SPLIT:
        return None
    half = n // 2
    gaps = np.empty(SPLITS)
    for k in range(SPLITS):
        order = rng.permutation(n)
        gaps[k] = abs(values[order[:half]].mean() - values[order[half:2 * half]].mean())
    return float(gaps.mean())


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def _realism_stats(
    run: pd.DataFrame, run_kinds: dict[str, dict[str, str]],
    refs: Sequence[tuple[pd.DataFrame, dict[str, dict[str, str]]]],
    conversations: Sequence[Conversation],
) -> list[HumanRealismStat]:
    by_condition: dict[str, set[str]] = {}
    for c in conversations:
        by_condition.setdefault(c.condition, set()).add(c.dialogue_id)
    scopes: list[tuple[str, set[str] | None]] = [("all", None), *sorted(by_condition.items())]
    stats = []
    for metric in REALISM_METRICS:
        human = np.concatenate([_values(run, run_kinds, metric, "human"),
                                *(_values(f, k, metric, "human") for f, k in refs)])
        if not human.size:
            continue  # no person ever sat on this metric's side
        spread = _spread(human, np.random.default_rng(_SEED))  # one stream per metric: stable
        human_mean = _mean(human)
        for condition, ids in scopes:
            sim = _values(run, run_kinds, metric, "llm", ids)
            sim_mean = _mean(sim)
            gap = None if sim_mean is None or human_mean is None else sim_mean - human_mean
            stats.append(HumanRealismStat(
                metric=metric, condition=condition, n_simulated=int(sim.size),
                simulated_mean=finite(sim_mean), n_human=int(human.size),
                human_mean=finite(human_mean), gap=finite(gap), human_spread=finite(spread),
                gap_over_spread=finite(abs(gap) / spread) if gap is not None and spread else None,
            ))
    return stats


def _column(dialogues: pd.DataFrame, name: str) -> pd.Series:
    if name in dialogues.columns:
        return dialogues[name]
    return pd.Series([None] * len(dialogues), index=dialogues.index, dtype=object)


def judge_calibration(dialogues: pd.DataFrame) -> JudgeCalibration | None:
    """The goal judge against the person's own verdicts, or ``None`` when no dialogue has a
    person's verdict."""
    from scipy.stats import spearmanr

    person = _column(dialogues, "person_goal_met")
    rating = _column(dialogues, "person_rating")
    if person.isna().all() and rating.isna().all():
        return None
    judged = _column(dialogues, "goal_met")
    reward = _column(dialogues, "reward")
    pairs = [(bool(j), bool(p)) for j, p in zip(judged, person, strict=True)
             if pd.notna(j) and pd.notna(p)]
    n = len(pairs)
    judge_rate = sum(j for j, _ in pairs) / n if n else None
    person_rate = sum(p for _, p in pairs) / n if n else None
    outcome = [float(r) if pd.notna(r) else (float(bool(j)) if pd.notna(j) else None)
               for r, j in zip(reward, judged, strict=True)]
    rated = [(float(r), o) for r, o in zip(rating, outcome, strict=True)
             if pd.notna(r) and o is not None]
    rho = p_value = None
    if len(rated) >= 3 and len({r for r, _ in rated}) > 1 and len({o for _, o in rated}) > 1:
        result = spearmanr([r for r, _ in rated], [o for _, o in rated])
        rho, p_value = finite(result.statistic), finite(result.pvalue)
    return JudgeCalibration(
        n=n,
        agreement=sum(j == p for j, p in pairs) / n if n else None,
        kappa=cohen_kappa([j for j, _ in pairs], [p for _, p in pairs]) if n else None,
        judge_rate=judge_rate, person_rate=person_rate,
        bias=judge_rate - person_rate if judge_rate is not None and person_rate is not None
        else None,
        n_rated=len(rated), spearman=rho, spearman_p=p_value,
    )


def _forks(dialogues: pd.DataFrame) -> dict[str, tuple[str, int]]:
    """Each fork's original dialogue id and the first turn that is new (``forked_at``)."""
    if "forked_from" not in dialogues.columns or "forked_at" not in dialogues.columns:
        return {}
    return {str(r["dialogue_id"]): (str(r["forked_from"]), int(r["forked_at"]))
            for r in dialogues.to_dict("records")
            if isinstance(r["forked_from"], str) and r["forked_from"] and pd.notna(r["forked_at"])}


def _cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _share(texts: list[str], measure: Callable[[list[str]], float | None]) -> float | None:
    values = [v for v in (measure([t]) for t in texts) if v is not None]
    return sum(values) / len(values) if values else None


def fork_comparison(runs: Sequence[RunData], embed: Embed) -> ForkComparison | None:
    """Same-prefix comparison over ``runs`` (the run and its reference): each fork's turn
    ``forked_at`` (the person's) against its original's turn at that index (the simulator's,
    after the same prefix). ``None`` when no dialogue is a fork."""
    forks: list[tuple[Conversation, str, int]] = []
    originals: dict[str, list[Conversation]] = {}
    for data in runs:
        marks = _forks(data.dialogues)
        for c in data.conversations:
            if c.dialogue_id in marks:
                forks.append((c, *marks[c.dialogue_id]))
            else:  # a fork's own id may repeat its original's (another run): not a candidate
                originals.setdefault(c.dialogue_id, []).append(c)
    if not forks:
        return None
    skipped: Counter[str] = Counter()
    pairs: list[tuple[Conversation, str, int, str, str]] = []
    for fork, original_id, t in forks:
        candidates = originals.get(original_id, [])  # several runs may hold one id: the one
        original = next((c for c in candidates  # whose prefix is the fork's, else the first
                         if c.texts[:t] == fork.texts[:t] and len(c.texts) > t), None) \
            or (candidates[0] if candidates else None)
        if original is None:
            skipped["original_not_found"] += 1  # pass the run it was forked from as --reference
        elif t >= len(fork.texts) or t >= len(original.texts):
            skipped["no_turn_t"] += 1
        elif fork.sides[t] != original.sides[t]:
            skipped["other_seat"] += 1
        elif fork.texts[:t] != original.texts[:t]:
            skipped["prefix_differs"] += 1
        else:
            pairs.append((fork, original_id, t, original.texts[t], fork.texts[t]))
    simulated, human = [p[3] for p in pairs], [p[4] for p in pairs]
    cosines: list[float] = []
    if pairs:
        a, b = l2_normalise(embed(simulated)), l2_normalise(embed(human))
        cosines = [float(x) for x in np.sum(a * b, axis=1)]
    mean, low, high, _ = mean_ci(cosines)
    words_sim = [float(len(word_tokens(t))) for t in simulated]
    words_human = [float(len(word_tokens(t))) for t in human]
    return ForkComparison(
        n_forks=len(forks), n_compared=len(pairs), skipped=dict(sorted(skipped.items())),
        cosine=finite(mean), cosine_ci_low=finite(low), cosine_ci_high=finite(high),
        words_simulated=finite(np.mean(words_sim)) if words_sim else None,
        words_human=finite(np.mean(words_human)) if words_human else None,
        politeness_simulated=_share(simulated, politeness_fraction),
        politeness_human=_share(human, politeness_fraction),
        frustration_simulated=_share(simulated, frustration_fraction),
        frustration_human=_share(human, frustration_fraction),
        examples=[ForkExample(dialogue_id=f.dialogue_id, forked_from=o, forked_at=t,
                              simulated=_cut(s_text), human=_cut(h_text), cosine=finite(cos))
                  for (f, o, t, s_text, h_text), cos in zip(pairs[:5], cosines, strict=False)],
    )


def _stores_people(reference: str | Path) -> bool:
    """Whether a run of the reference stores the seat kinds (format 1.10, a run with a person
    in a seat), read from the tables' schema without loading them."""
    from spasm.dataset.reader import open_run

    for path in reference_paths(reference):
        try:
            run = open_run(path, verify=False)
            if run.has("dialogues") and "client_kind" in run.stored_columns("dialogues"):
                return True
            if run.has("participants") and "kind" in run.stored_columns("participants"):
                return True
        except UserError:
            return True  # unreadable: load_reference says why
    return False


def human_stage(
    data: RunData, frame: pd.DataFrame, reference: str | Path | None, embed: Embed | None = None,
) -> HumanMetrics | None:
    """Simulator vs people, judge calibration and forks for a run (its realism ``frame``, from
    :func:`~spasm.evaluation.realism.realism_frame`) and its ``reference`` (a run, or a folder
    of runs such as ``RUN.play/``: :func:`~spasm.evaluation.loader.load_reference`); ``None``
    when neither has a dialogue with a person in a seat."""
    run_kinds = _kinds(data)
    if not _has_person(run_kinds) and (reference is None or not _stores_people(reference)):
        return None  # no person anywhere: the reference is not read a second time
    refs = load_reference(reference) if reference is not None else []
    ref_frames = [human_frame(r) for r in refs]
    n_run = _has_person(run_kinds)
    n_ref = sum(_has_person(kinds) for _, kinds in ref_frames)
    if not n_run and not n_ref:
        return None
    notes: list[str] = []
    if len(refs) > 1:
        notes.append(f"The reference is {len(refs)} runs under {reference}, pooled.")
    mixed = _mixed(run_kinds) + sum(_mixed(kinds) for _, kinds in ref_frames)
    if mixed:
        notes.append(f"{mixed} group dialogue(s) have people and models in seats of one role: "
                     "that side is in neither the human nor the simulated set.")
    stats = _realism_stats(frame, run_kinds, ref_frames, data.conversations)
    n_human = max((s.n_human for s in stats), default=0)
    if stats and n_human < _MIN_SPLIT:
        notes.append(f"Only {n_human} human dialogue(s): the human–human spread needs at least "
                     f"{_MIN_SPLIT} (two halves of two), so there is no ceiling.")
    if not any(s.n_simulated for s in stats):
        notes.append("No simulated dialogue on the sides people sat on: human values only.")
    # Each play session is its own run: the verdicts of the run and its reference are pooled,
    # each dialogue with the goal judge's decision its own run recorded.
    calibration = judge_calibration(pd.concat([data.dialogues, *(r.dialogues for r in refs)],
                                              ignore_index=True))
    if calibration is not None and refs:
        in_ref = judge_calibration(pd.concat([r.dialogues for r in refs], ignore_index=True))
        if in_ref is not None and in_ref.n:
            notes.append(f"Judge calibration pools the run's and the reference's verdicts "
                         f"({in_ref.n} of the {calibration.n} from the reference, each judged "
                         "in its own run).")
    if calibration is not None and calibration.n == 0:
        notes.append("No dialogue has both the goal judge's goal_met and the person's "
                     "person_goal_met (a run without scenarios has no judge): no κ or bias.")
    forks = None
    if embed is not None:
        forks = fork_comparison([data, *refs], embed)
        if forks is not None and forks.skipped.get("original_not_found"):
            notes.append(f"{forks.skipped['original_not_found']} fork(s) whose original is "
                         "neither in the run nor in the reference: evaluate the run it was "
                         "forked from with --reference the fork's run (or the other way round).")
    return HumanMetrics(
        reference=str(reference) if reference is not None else None,
        n_human_run=n_run, n_human_reference=n_ref, splits=SPLITS, stats=stats,
        calibration=calibration, forks=forks, notes=notes,
    )


def _or_dash(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or "—" when there is none."""
    return "—" if value is None else format(value, spec)


def summary_lines(h: HumanMetrics) -> list[str]:
    """What ``spasm eval`` prints of the human comparison: the metrics furthest from people
    relative to their ceiling, and the judge's calibration."""
    lines = [f"Against people ({h.n_human_run} in the run, {h.n_human_reference} in the "
             "reference): simulated vs human mean, human-human spread in brackets"]
    for s in [s for s in h.stats if s.condition == "all"]:
        ratio = "" if s.gap_over_spread is None else f", |gap|/spread {s.gap_over_spread:.1f}"
        sim = _or_dash(s.simulated_mean, ".3f")
        human = _or_dash(s.human_mean, ".3f")
        spread = _or_dash(s.human_spread, ".3f")
        lines.append(f"  {s.metric}: {sim} vs {human} [{spread}]{ratio}")
    c = h.calibration
    if c is not None:
        kappa = _or_dash(c.kappa, ".2f")
        bias = _or_dash(c.bias, "+.2f")
        rho = "" if c.spearman is None else f"; Spearman {c.spearman:.2f} (n={c.n_rated})"
        lines.append(f"Goal judge vs person (n={c.n}): kappa {kappa}, bias {bias}{rho}")
    f = h.forks
    if f is not None:
        cos = _or_dash(f.cosine, ".2f")
        words = ("" if f.words_simulated is None or f.words_human is None
                 else f", words {f.words_simulated:.1f} (simulator) vs {f.words_human:.1f} (person)")
        skipped = "".join(f", {n} {k}" for k, n in f.skipped.items())
        lines.append(f"Forks, same prefix ({f.n_compared} of {f.n_forks} compared{skipped}): "
                     f"cosine simulator vs person {cos}{words}")
    return lines
