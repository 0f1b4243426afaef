"""The LLM-judged stages with one judge or several: echoing, persona consistency, and the
ensemble report (each judge's result, Fleiss' κ between them, their disagreements).

Judges run one after another on the evaluation's event loop (:class:`EvalLLM`), each through
the engine's caller with its own backend, so every call is cached and logged like any other.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from tqdm import tqdm

from spasm.dataset.columns import PersonaProbe
from spasm.evaluation.consistency import (
    CONSISTENCY_ROLE,
    ConsistencyVerdict,
    Measure,
    judge_consistency,
    measure_column,
)
from spasm.evaluation.echoing import EchoVerdict
from spasm.evaluation.ensemble import (
    DISAGREEMENTS_LISTED,
    agreement,
    family_warning,
    line_labels,
    majority_echoing,
    model_family,
)
from spasm.evaluation.judge import judge_echoing
from spasm.evaluation.llm import EvalLLM
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import (
    ConsistencyMetrics,
    ConsistencyStat,
    JudgeAgreement,
    JudgeDisagreement,
    JudgeEnsemble,
    JudgeResult,
)
from spasm.evaluation.stats import finite, mean_ci
from spasm.evaluation.summary import group_key

__all__ = ["consistency_stage", "echo_judges", "ensemble_report"]

MEASURES: tuple[Measure, ...] = ("prompt_to_line", "line_to_line")


def _bar(total: int, desc: str, show: bool) -> tqdm[object]:
    return tqdm(total=total, desc=desc, unit="it", disable=not show, leave=False, dynamic_ncols=True)


def echo_judges(
    llm: EvalLLM,
    convs: list[Conversation],
    rule: Mapping[str, EchoVerdict],
    *,
    concurrency: int,
    show: bool,
) -> tuple[dict[str, EchoVerdict], dict[str, dict[str, EchoVerdict]], int, int]:
    """Every judge's echoing verdicts and the ensemble's (one judge: its own).

    Returns ``(verdicts, per judge, calls, fallbacks)``, calls and fallbacks summed over judges.
    """
    per_judge: dict[str, dict[str, EchoVerdict]] = {}
    calls = fallbacks = 0
    for b in llm.backends:
        label = "judging echoing" + (f" ({b.name})" if len(llm.backends) > 1 else "")
        with _bar(len(convs), label, show) as bar:
            job = functools.partial(
                judge_echoing, convs, dict(rule), concurrency=concurrency, on_done=bar.update
            )
            verdicts, n_calls, n_fallbacks = llm.run(job, backend=b.name)
        per_judge[b.name] = verdicts
        calls += n_calls
        fallbacks += n_fallbacks
    return majority_echoing(rule, per_judge), per_judge, calls, fallbacks


def consistency_stage(
    llm: EvalLLM,
    convs: list[Conversation],
    cards: Mapping[str, str],
    *,
    concurrency: int,
    show: bool,
    qa: Mapping[tuple[str, str], Sequence[PersonaProbe]] | None = None,
    own: Mapping[str, Conversation] | None = None,
) -> tuple[ConsistencyMetrics, dict[str, dict[str, float | None]], dict[str, dict[str, ConsistencyVerdict]]]:
    """Persona consistency by every judge (Q&A too when ``qa`` holds the run's persona probes,
    by dialogue).

    ``own``: the conversations whose Client lines changed on own content
    (:func:`spasm.evaluation.owncontent.own_conversations`); with it, prompt-to-line is judged
    on them too (``consistency_prompt_to_line_own``), and every other dialogue reuses its raw
    labels (its lines are its own).

    Returns the metrics, each dialogue's scores (``consistency_<measure>``, ``qa_consistency``:
    the mean of every judge's labels) and every judge's verdicts.
    """
    measures: tuple[Measure, ...] = (*MEASURES, "qa") if qa else MEASURES
    per_judge: dict[str, dict[str, ConsistencyVerdict]] = {}
    fallbacks = 0
    for b in llm.backends:
        label = "judging consistency" + (f" ({b.name})" if len(llm.backends) > 1 else "")
        with _bar(len(convs), label, show) as bar:
            job = functools.partial(
                judge_consistency, convs, cards, concurrency=concurrency, on_done=bar.update, qa=qa
            )
            verdicts, n_fallbacks = llm.run(job, backend=b.name)
        per_judge[b.name] = verdicts
        fallbacks += n_fallbacks
    own_judged: dict[str, dict[str, ConsistencyVerdict]] = {}
    for b in llm.backends if own is not None else ():
        label = "judging own content" + (f" ({b.name})" if len(llm.backends) > 1 else "")
        changed = list((own or {}).values())
        with _bar(len(changed), label, show) as bar:
            job = functools.partial(judge_consistency, changed, cards, concurrency=concurrency,
                                    on_done=bar.update, measures=("prompt_to_line",))
            own_judged[b.name], n_fallbacks = llm.run(job, backend=b.name)
        fallbacks += n_fallbacks
    scores: dict[str, dict[str, float | None]] = {}
    for conv in convs:
        row: dict[str, float | None] = {}
        for measure in measures:
            labels = [
                x
                for v in per_judge.values()
                if conv.dialogue_id in v
                for x in (getattr(v[conv.dialogue_id], measure) or [])
            ]
            row[measure_column(measure)] = sum(labels) / len(labels) if labels else None
        if own is not None:
            source = own_judged if conv.dialogue_id in own else per_judge
            labels = [x for v in source.values() if conv.dialogue_id in v
                      for x in (v[conv.dialogue_id].prompt_to_line or [])]
            row[OWN_PROMPT_TO_LINE] = sum(labels) / len(labels) if labels else None
        scores[conv.dialogue_id] = row
    calls = sum(llm.sessions[b.name].calls(CONSISTENCY_ROLE) for b in llm.backends)
    notes = [] if qa else [
        "Q&A consistency (questions about the persona put to the simulated Client) is not "
        "measured: run with harness.persona_probes."
    ]
    if not any(c.persona_id in cards and cards[c.persona_id].strip() for c in convs):
        notes.append("No persona has a card, so there is no prompt-to-line score.")
    return (
        ConsistencyMetrics(
            judges=[b.name for b in llm.backends],
            calls=calls,
            fallbacks=fallbacks,
            stats=_stats(convs, scores, measures) + (_own_stats(convs, scores) if own is not None else []),
            notes=notes,
        ),
        scores,
        per_judge,
    )


def _stats(
    convs: Sequence[Conversation], scores: Mapping[str, Mapping[str, float | None]],
    measures: Sequence[Measure] = MEASURES,
) -> list[ConsistencyStat]:
    groups: dict[tuple[str, str], list[Conversation]] = {}
    for c in convs:
        groups.setdefault((c.pairing, c.condition), []).append(c)
    scopes = [(("all", "all"), list(convs)), *sorted(groups.items(), key=group_key)]
    out = []
    for (pairing, condition), members in scopes:
        for measure in measures:
            column = measure_column(measure)
            values = [v for c in members if (v := scores[c.dialogue_id][column]) is not None]
            mean, low, high, n = mean_ci(values)
            out.append(
                ConsistencyStat(
                    measure=measure,
                    pairing=pairing,
                    condition=condition,
                    n=n,
                    mean=finite(mean),
                    ci_low=finite(low),
                    ci_high=finite(high),
                )
            )
    return out


OWN_PROMPT_TO_LINE = "consistency_prompt_to_line_own"


def _own_stats(convs: Sequence[Conversation], scores: Mapping[str, Mapping[str, float | None]]
               ) -> list[ConsistencyStat]:
    """Prompt-to-line on own content, summarised like the raw measures."""
    groups: dict[tuple[str, str], list[Conversation]] = {}
    for c in convs:
        groups.setdefault((c.pairing, c.condition), []).append(c)
    out = []
    scopes = [(("all", "all"), list(convs)), *sorted(groups.items(), key=group_key)]
    for (pairing, condition), members in scopes:
        values = [v for c in members if (v := scores[c.dialogue_id].get(OWN_PROMPT_TO_LINE)) is not None]
        mean, low, high, n = mean_ci(values)
        out.append(ConsistencyStat(measure="prompt_to_line_own", pairing=pairing, condition=condition, n=n,
                                   mean=finite(mean), ci_low=finite(low), ci_high=finite(high)))
    return out


def ensemble_report(
    llm: EvalLLM,
    echo: Mapping[str, Mapping[str, EchoVerdict]] | None,
    consistency: Mapping[str, Mapping[str, ConsistencyVerdict]] | None,
) -> JudgeEnsemble:
    """Each judge's result, the judges' agreement and disagreements, and the family warning."""
    families = {b.name: model_family(b.config.model, b.config.kind) for b in llm.backends}
    models = {b.name: b.config.model for b in llm.backends}
    results: list[JudgeResult] = []
    agreements: list[JudgeAgreement] = []
    disagreements: list[JudgeDisagreement] = []

    def add(metric: str, labels: dict[str, dict[str, object]]) -> None:
        if len(labels) < 2:
            return
        agreed, differ = agreement(metric, labels)
        agreements.append(agreed)
        disagreements.extend(differ[:DISAGREEMENTS_LISTED])

    if echo is not None:
        labels: dict[str, dict[str, object]] = {}
        for name, verdicts in echo.items():
            judged = {d: v for d, v in verdicts.items() if v.method == "judge"}
            labels[name] = {d: "echoing" if v.echoing else "no" for d, v in judged.items()}
            results.append(
                JudgeResult(
                    judge=name, model=models[name], family=families[name], metric="echoing",
                    n=len(judged),
                    value=sum(v.echoing for v in judged.values()) / len(judged) if judged else None,
                    fallbacks=len(verdicts) - len(judged),
                )
            )
        add("echoing", labels)
    if consistency is not None:
        asked = any(v.qa is not None or "qa" in v.failed
                    for verdicts in consistency.values() for v in verdicts.values())
        for measure in (*MEASURES, "qa") if asked else MEASURES:
            labels = {}
            for name, judged_lines in consistency.items():
                per_dialogue = {d: getattr(v, measure) for d, v in judged_lines.items()}
                scored = [c.score(measure) for c in judged_lines.values() if getattr(c, measure)]
                labels[name] = dict(line_labels(per_dialogue, start=1 if measure == "line_to_line" else 0))
                results.append(
                    JudgeResult(
                        judge=name, model=models[name], family=families[name],
                        metric=measure_column(measure), n=len(scored),
                        value=sum(s for s in scored if s is not None) / len(scored) if scored else None,
                        fallbacks=sum(measure in c.failed for c in judged_lines.values()),
                    )
                )
            add(measure_column(measure), labels)
    warning = family_warning(families)
    return JudgeEnsemble(
        judges=[b.name for b in llm.backends],
        families=families,
        results=results,
        agreement=agreements,
        disagreements=disagreements,
        usage=[llm.usage(b.name) for b in llm.backends],
        warnings=[warning] if warning else [],
    )
