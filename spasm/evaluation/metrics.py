"""The result of an evaluation, as pydantic models (serialised to ``eval/metrics.json``).

``None`` in a numeric field means "could not be computed"; the neighbouring ``note``
says why. Bump :data:`SCHEMA_VERSION` whenever a field changes meaning.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spasm.registry import ordered_conditions

__all__ = [
    "SCHEMA_VERSION",
    "ConditionSummary",
    "ConsistencyMetrics",
    "ConsistencyStat",
    "Counts",
    "DriftMetrics",
    "DriftPoint",
    "EchoExample",
    "EchoOnsetCurve",
    "EchoRate",
    "EchoingMetrics",
    "ForkComparison",
    "ForkExample",
    "GroupExample",
    "GroupMetrics",
    "GroupParticipantStat",
    "GroupRate",
    "GroupStat",
    "HumanMetrics",
    "HumanRealismStat",
    "JudgeAgreement",
    "JudgeCalibration",
    "JudgeDisagreement",
    "JudgeEnsemble",
    "JudgeResult",
    "LLMUsage",
    "LanguageFlag",
    "LanguageMetrics",
    "LanguageStat",
    "Metrics",
    "OwnContentMetrics",
    "OwnContentStat",
    "OwnDrift",
    "PairedComparison",
    "PassHatK",
    "PayloadLeakExample",
    "PayloadLeakMetrics",
    "PayloadLeakRate",
    "RealismMetrics",
    "RealismReference",
    "RealismStat",
    "ReferenceStat",
    "ReliabilityMetrics",
    "ReliabilityRow",
    "SeparabilityGroup",
    "SimulatorErrorMetrics",
    "SimulatorErrorRate",
    "SimulatorExample",
]

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Counts(_Model):
    """How much data went into the evaluation."""

    personas: int
    dialogues_total: int = Field(description="rows in dialogues.parquet, any status")
    dialogues_ok: int = Field(description="dialogues with status == 'ok' that have turns")
    utterances: int
    client_turns: int
    texts_embedded: int = Field(description="texts sent to the embedder (cache misses)")
    texts_cached: int = Field(description="embedding lookups answered by the cache")


class DriftPoint(_Model):
    """Mean drift of one dimension at one client turn under one condition."""

    dimension: str
    condition: str
    turn: int = Field(description="0-based index over the Client's turns")
    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class ConditionSummary(_Model):
    """Per-dialogue mean drift (client turns >= 1), summarised for one condition."""

    dimension: str
    condition: str
    n_dialogues: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class PairedComparison(_Model):
    """ECP vs CONCAT on per-dialogue mean drift, paired by persona, conversation and pairing."""

    dimension: str
    pairing: str = Field(description="a pairing, or 'all'")
    n_pairs: int
    mean_ecp: float | None
    mean_concat: float | None
    delta: float | None = Field(description="mean of (ECP − CONCAT) over pairs")
    delta_ci_low: float | None
    delta_ci_high: float | None
    cohen_d: float | None = Field(description="paired: mean difference / sd of differences")
    p_ttest: float | None
    p_wilcoxon: float | None
    note: str | None = None


class OwnDrift(_Model):
    """Drift on the Client's own content (copied spans removed; docs/evaluation.md, "Own
    content"): the same curves, summaries and ECP-vs-CONCAT comparison as the raw drift."""

    dimensions: list[str] = Field(description="the dimensions measured on own content")
    curves: list[DriftPoint]
    by_condition: list[ConditionSummary]
    comparisons: list[PairedComparison]
    notes: list[str] = Field(default_factory=list)


class DriftMetrics(_Model):
    """Drift curves and the ECP-vs-CONCAT comparison."""

    mode: Literal["cheap", "probe"]
    dimensions: list[str]
    references: dict[str, str] = Field(description="how A(0) and A(t) are defined per dimension")
    curves: list[DriftPoint]
    by_condition: list[ConditionSummary]
    comparisons: list[PairedComparison]
    probe_calls: int = 0
    probe_fallbacks: int = 0
    notes: list[str] = Field(default_factory=list)

    def comparison_title(self) -> str:
        """What the paired table compares: ECP vs CONCAT, and, in a run with more conditions,
        that it leaves the others to the table against the baseline."""
        conditions = ordered_conditions({c.condition for c in self.by_condition})
        others = [c for c in conditions if c not in ("ecp", "concat")]
        if not others:
            return "ECP vs CONCAT"
        return (f"ECP vs CONCAT only (2 of the run's {len(conditions)} conditions: "
                f"{', '.join(conditions)}; every condition against the baseline is compared in "
                "the table of all metrics)")
    own: OwnDrift | None = Field(None, description="the same drift on the Client's own content")


class EchoRate(_Model):
    """Share of conversations flagged as echoing, with a Wilson 95% interval."""

    pairing: str
    condition: str
    n: int
    n_echoing: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    by_client: int = 0
    by_responder: int = 0


class EchoExample(_Model):
    """One flagged conversation with its evidence (shown in the report)."""

    dialogue_id: str
    pairing: str
    condition: str
    who: Literal["client", "responder", "none"]
    score: float
    evidence: list[str]
    method: Literal["rule", "judge"]


class EchoOnsetCurve(_Model):
    """When echoing starts: the share of a group's dialogues echoing by utterance t."""

    pairing: str
    condition: str
    n: int
    n_echoing: int
    share_by_turn: list[float] = Field(
        description="t = 0, 1, ...: share of the group's dialogues whose echoing began at utterance <= t"
    )
    at_risk: list[int] = Field(
        description="t = 0, 1, ...: dialogues of the group with more than t utterances"
    )
    median_onset: float | None = Field(description="median onset utterance of the echoing dialogues")
    first_onset: int | None = None


class EchoingMetrics(_Model):
    """Echoing rates per pairing × condition and how they were decided."""

    method: Literal["rule", "judge"]
    threshold: float
    rates: list[EchoRate]
    overall: EchoRate
    examples: list[EchoExample]
    judge_calls: int = 0
    judge_fallbacks: int = 0
    kappa_rule_vs_judge: float | None = None
    kappa_human: float | None = None
    human_note: str | None = None
    onset: list[EchoOnsetCurve] = Field(default_factory=list, description="per pairing × condition")


class LLMUsage(_Model):
    """The evaluation's own model calls (probe and judge), as logged in the run's calls table."""

    backend: str
    kind: str
    model: str
    source: str = Field(description="where the backend came from (run config, given, embedded default)")
    calls: int = Field(description="call-log rows: every request, re-ask, retry and cache hit")
    cache_hits: int
    prompt_tokens: int = Field(description="tokens of the requests actually sent (not cache hits)")
    completion_tokens: int
    cost: float = Field(description="at the backend's configured prices; cache hits cost nothing")
    calls_by_role: dict[str, int]
    outcomes: dict[str, int]


class SeparabilityGroup(_Model):
    """Persona separability of the Client side within one pairing × condition."""

    pairing: str
    condition: str
    n_conversations: int
    n_personas: int
    silhouette: float | None
    davies_bouldin: float | None
    intra_mean: float | None = Field(description="mean cosine distance between conversations of one persona")
    intra_sd: float | None
    retrieval: Literal["card", "centroid"]
    n_queries: int
    acc_at_k: list[float | None] = Field(description="Acc@K for K = 1..len")
    random_at_k: list[float | None] = Field(description="random baseline min(1, K/N)")
    note: str | None = None


class ReferenceStat(_Model):
    """One realism metric over the reference corpus's dialogues (its z-score basis)."""

    metric: str
    n: int
    mean: float | None
    sd: float | None = Field(description="sample sd (ddof=1)")


class RealismReference(_Model):
    """The corpus the run's realism metrics are standardised against (``--reference``)."""

    run_dir: str
    dialogues: int
    stats: list[ReferenceStat]


class RealismStat(_Model):
    """One realism metric over one pairing × condition (or ``all``), and against the reference."""

    metric: str = Field(description="the per_dialogue.parquet column, e.g. mattr_client")
    pairing: str
    condition: str
    n: int = Field(description="dialogues where the metric is defined")
    mean: float | None
    sd: float | None
    ci_low: float | None
    ci_high: float | None
    mean_z: float | None = Field(None, description="mean z-score against the reference's dialogues")
    z_ci_low: float | None = None
    z_ci_high: float | None = None


class RealismMetrics(_Model):
    """Lexical diversity per side and the Client-side diagnostics (docs/evaluation.md)."""

    mattr_window: int
    hdd_sample: int
    metrics: list[str]
    definitions: dict[str, str]
    reference: RealismReference | None = None
    stats: list[RealismStat]
    notes: list[str] = Field(default_factory=list)


class ConsistencyStat(_Model):
    """Mean persona consistency (share of consistent Client lines) of one group's dialogues."""

    measure: Literal["prompt_to_line", "line_to_line", "qa", "prompt_to_line_own"]
    pairing: str
    condition: str
    n: int = Field(description="dialogues with a score")
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class ConsistencyMetrics(_Model):
    """Persona consistency (Abdulhai et al., 2025) judged by the LLM judge(s)."""

    judges: list[str]
    calls: int = Field(description="call-log rows of the role eval_consistency")
    fallbacks: int = Field(description="measures whose reply never validated or whose call failed")
    stats: list[ConsistencyStat]
    notes: list[str] = Field(default_factory=list)


class JudgeResult(_Model):
    """One judge's result on one LLM-judged metric."""

    judge: str = Field(description="backend name")
    model: str
    family: str
    metric: str = Field(
        description="echoing, consistency_prompt_to_line, consistency_line_to_line or qa_consistency"
    )
    n: int = Field(description="dialogues it judged (fallbacks excluded)")
    value: float | None = Field(description="echoing rate, or mean consistency")
    fallbacks: int = 0


class JudgeAgreement(_Model):
    """Agreement between the judges on one metric, over the items all of them labelled."""

    metric: str
    statistic: Literal["fleiss"]
    n_judges: int
    n_items: int = Field(description="dialogues (echoing) or Client lines (consistency)")
    kappa: float | None
    n_disagreements: int
    agreement: float | None = Field(description="share of items with one label from every judge")


class JudgeDisagreement(_Model):
    """An item the judges labelled differently: a dialogue, or ``<dialogue_id>#<line>``."""

    metric: str
    item: str
    labels: dict[str, str]


class JudgeEnsemble(_Model):
    """Several judges on the LLM-judged metrics: each one's result, agreement, disagreements."""

    judges: list[str]
    families: dict[str, str] = Field(description="judge -> model family")
    results: list[JudgeResult]
    agreement: list[JudgeAgreement]
    disagreements: list[JudgeDisagreement] = Field(description="up to 50 per metric")
    usage: list[LLMUsage] = Field(default_factory=list, description="per judge")
    warnings: list[str] = Field(default_factory=list)


class LanguageStat(_Model):
    """Language compliance of one side over one group's dialogues."""

    side: Literal["client", "responder"]
    pairing: str
    condition: str
    n: int = Field(description="dialogues with a classified utterance on this side")
    mean: float | None = Field(description="mean share of classified utterances in the expected language")
    ci_low: float | None
    ci_high: float | None
    off_language: int = Field(description="utterances flagged as another language")


class LanguageFlag(_Model):
    """One utterance identified as another language than the persona's."""

    dialogue_id: str
    turn_index: int
    speaker: str
    expected: str
    detected: str
    probability: float
    text: str


class GoalRate(_Model):
    """Share of a group's dialogues whose scenario goal was met, with a Wilson 95% interval.

    ``pairing`` is a pairing or ``all``; ``scenario_id`` a scenario or ``all``."""

    pairing: str
    condition: str
    scenario_id: str = "all"
    n: int = Field(description="dialogues the goal judge decided")
    n_met: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    undecided: int = Field(0, description="dialogues of the group with no goal verdict")


class GoalMetrics(_Model):
    """Goal success of a run with scenarios: per condition (all pairings), per pairing ×
    condition, and per scenario × condition."""

    rates: list[GoalRate]
    scenarios: int


class PassHatK(_Model):
    """pass^k of one group of tasks for one k, by both estimators, and its noise floor."""

    k: int
    unbiased: float | None = Field(description="mean over tasks of C(c,k)/C(n,k)")
    all_of_k: float | None = Field(description="share of disjoint k-groups of trials that all pass")
    tasks: int = Field(description="tasks with at least k decided trials (used by unbiased)")
    groups: int = Field(description="k-groups of trials counted by all_of_k")
    noise_floor: float | None = Field(
        description="95th percentile of |pass^k difference| between two bootstrap runs of this size")


class ReliabilityRow(_Model):
    """Reliability of one group of tasks (a task: one planned dialogue, run once per trial).

    ``pairing`` is a pairing or ``all``; ``scenario_id`` a scenario or ``all``."""

    pairing: str
    condition: str
    scenario_id: str = "all"
    tasks: int
    trials: int = Field(description="the most trials a task has")
    dialogues: int
    undecided: int = Field(description="dialogues without an outcome (left out)")
    successes: int
    pass_hat: list[PassHatK] = Field(description="k = 1..trials")
    flipped: int = Field(description="tasks whose outcome differs between trials")
    flip_share: float | None = Field(description="flipped / tasks with two or more decided trials")


class ReliabilityMetrics(_Model):
    """pass^k and the noise floor of a run with trials (``trials: K``)."""

    outcome: Literal["reward", "goal_met"] = Field(description="the column a dialogue's success is read from")
    trials: int
    tasks: int
    estimators: dict[str, str]
    bootstrap_replicates: int
    confidence: float
    rows: list[ReliabilityRow]
    notes: list[str] = Field(default_factory=list)


class SimulatorErrorRate(_Model):
    """The simulated Client's judged errors over one group of reviewed dialogues, with Wilson
    95% intervals. ``pairing`` and ``condition`` are one or ``all``."""

    pairing: str
    condition: str
    n: int = Field(description="dialogues reviewed")
    with_error: int
    critical: int = Field(description="dialogues with a critical_helped or critical_hindered error")
    critical_share: float | None
    critical_ci_low: float | None
    critical_ci_high: float | None
    critical_helped: int
    critical_hindered: int
    failed: int = Field(description="reviewed dialogues whose outcome is a failure")
    failed_critical: int = Field(description="of those, dialogues with a critical simulator error")
    failed_critical_share: float | None
    failed_ci_low: float | None
    failed_ci_high: float | None
    passed: int = Field(description="reviewed dialogues whose outcome is a success")
    passed_helped: int = Field(description="of those, dialogues with a critical_helped error")
    passed_helped_share: float | None
    passed_ci_low: float | None
    passed_ci_high: float | None
    tags: dict[str, int] = Field(description="errors by tag")


class SimulatorExample(_Model):
    """A critical simulator error, with the utterance it is in."""

    dialogue_id: str
    condition: str
    turn: int
    tags: list[str]
    severity: str
    reason: str
    text: str


class SimulatorErrorMetrics(_Model):
    """The simulated Client's errors as an LLM judge reviews them (``--simulator-errors``)."""

    judge: str
    calls: int
    fallbacks: int
    misplaced: int = Field(description="errors placed on a turn that is not the Client's (dropped)")
    reviewed: int
    tags: dict[str, str]
    severities: dict[str, str]
    rates: list[SimulatorErrorRate]
    examples: list[SimulatorExample] = Field(description="up to 10 critical errors")
    notes: list[str] = Field(default_factory=list)


class PayloadLeakRate(_Model):
    """Share of dialogues with a Client utterance that repeats a payload its egocentric frame
    hid, with a Wilson 95% interval. ``pairing`` and ``condition`` are one or ``all``."""

    pairing: str
    condition: str
    n: int = Field(description="dialogues checked (a run with an events table)")
    n_leaking: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    utterances: int = Field(description="Client utterances with a leaked span")
    spans: int


class PayloadLeakExample(_Model):
    """One leaked span, with the utterance and the event it came from."""

    dialogue_id: str
    condition: str
    turn: int
    speaker: str
    span: str
    tool: str | None
    actor: str = Field(description="who made the call whose payload leaked")
    text: str


class PayloadLeakMetrics(_Model):
    """``payload_leak`` (runs with an events table): what CONCAT lets the simulated user see."""

    frame: str = Field(description="the condition whose frame says what the Client could see")
    min_chars: int
    max_words: int
    checked: int
    rates: list[PayloadLeakRate]
    examples: list[PayloadLeakExample] = Field(description="up to 10")
    notes: list[str] = Field(default_factory=list)


class GroupRate(_Model):
    """Share of a condition's group dialogues a detector flags, with a Wilson 95% interval."""

    metric: Literal["impersonation", "echo", "silence", "loop"]
    condition: str = Field(description="a condition, or 'all'")
    n: int
    n_flagged: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None


class GroupStat(_Model):
    """Mean of a per-dialogue group metric over a condition, with a t 95% interval."""

    metric: str = Field(description="impersonation_share, echo_max, silence_rate, loop_longest, drift_<dim>")
    condition: str = Field(description="a condition, or 'all'")
    n: int = Field(description="dialogues where the metric is defined")
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class GroupParticipantStat(_Model):
    """One participant id under one condition, over the dialogues it sits in."""

    participant_id: str
    role: str
    condition: str
    n_dialogues: int
    n_utterances: int
    impersonations: int = Field(description="its utterances that speak as another participant")
    impersonation_share: float | None = Field(description="mean per-dialogue share of its utterances")
    impersonation_ci_low: float | None
    impersonation_ci_high: float | None
    addressed: int = Field(description="times it was named with a full window to answer")
    silences: int = Field(description="of those, times it did not speak within the window")
    echo_max: float | None = Field(description="mean over dialogues of its highest copy share from anyone")
    drift_utterance: float | None = Field(description="client seats: mean drift vs its opening utterance")


class GroupExample(_Model):
    """A flagged utterance or dialogue, with its evidence (for the report)."""

    kind: Literal["impersonation", "echo", "silence", "loop"]
    dialogue_id: str
    condition: str
    turn_index: int | None = Field(description="0-based utterance position")
    participant: str = Field(description="who impersonates, copies, stays silent, or loops")
    other: str = Field(description="whom it impersonates or copies, who addressed it, its loop partner")
    evidence: str
    score: float | None = None


class GroupMetrics(_Model):
    """Role confusion in group dialogues (runs with a participants table)."""

    dialogues: int
    participants_max: int
    echo_threshold: float
    loop_min: int
    definitions: dict[str, str]
    rates: list[GroupRate]
    stats: list[GroupStat]
    by_participant: list[GroupParticipantStat]
    examples: list[GroupExample] = Field(description="up to 10 per kind")
    notes: list[str] = Field(default_factory=list)


class LanguageMetrics(_Model):
    """Language compliance (an offline identifier on every utterance long enough)."""

    identifier: str
    min_letters: int
    min_confidence: float
    expected: list[str] = Field(description="the expected languages found (ISO 639-1)")
    n_flagged: int
    stats: list[LanguageStat]
    flagged: list[LanguageFlag] = Field(description="up to 20, most confident first")


class OwnContentStat(_Model):
    """How much of one condition's Client words were copied, and what own content kept."""

    condition: str = Field(description="a condition, or 'all'")
    dialogues: int = Field(description="dialogues whose Client side has words")
    utterances: int = Field(description="client-side utterances (client seats in a group)")
    with_copying: int = Field(description="utterances with at least one copied word")
    left_out: int = Field(description="utterances left with too few words of their own")
    copied_share: float | None = Field(description="mean per-dialogue share of Client words copied")
    copied_share_ci_low: float | None
    copied_share_ci_high: float | None


class OwnContentMetrics(_Model):
    """The own-content rule and how much it removed (docs/evaluation.md, "Own content")."""

    ngram: int = Field(description="a copied span is a run of at least this many words")
    min_words: int = Field(description="an utterance keeping fewer own words than this is left out")
    definition: str
    stats: list[OwnContentStat]
    notes: list[str] = Field(default_factory=list)


class HumanRealismStat(_Model):
    """One realism metric for the simulator and for people side by side, with the people's
    own spread (two halves of the human set) as the ceiling a simulator can reach."""

    metric: str
    condition: str = Field(description="the simulated dialogues' condition, or 'all'")
    n_simulated: int
    simulated_mean: float | None
    n_human: int
    human_mean: float | None
    gap: float | None = Field(description="simulated mean minus human mean")
    human_spread: float | None = Field(
        description="mean |difference of the means| of two random halves of the human set "
        "(the human-human control); None under 4 human dialogues")
    gap_over_spread: float | None = Field(
        description="|gap| / human_spread: 1 or less is as close as two groups of people are")


class JudgeCalibration(_Model):
    """The LLM goal judge against what the person said at the end of a play session."""

    n: int = Field(description="dialogues with both the judge's goal_met and person_goal_met")
    agreement: float | None = Field(description="share of those where the two agree")
    kappa: float | None = Field(description="Cohen's kappa, judge vs person")
    judge_rate: float | None = Field(description="share the judge says met")
    person_rate: float | None = Field(description="share the person says met")
    bias: float | None = Field(description="judge_rate minus person_rate (> 0: the judge overrates)")
    n_rated: int = Field(description="dialogues with both a judge outcome and a person_rating")
    spearman: float | None = Field(
        description="Spearman's rho of the person's 1-5 rating and the judge's outcome (the "
        "reward where the run has one, else goal_met as 0/1)")
    spearman_p: float | None


class ForkExample(_Model):
    """One fork's turn t: what the simulator said on the prefix, and what the person said."""

    dialogue_id: str = Field(description="the fork (the person's dialogue)")
    forked_from: str
    forked_at: int
    simulated: str = Field(description="the original's turn t (cut to 300 characters)")
    human: str = Field(description="the fork's turn t (cut to 300 characters)")
    cosine: float | None


class ForkComparison(_Model):
    """Same-prefix comparison: each fork's first new turn (the person's) against the
    original's turn at the same index (the simulator's, on the same prefix)."""

    n_forks: int = Field(description="dialogues with forked_from in the run and the reference")
    n_compared: int
    skipped: dict[str, int] = Field(
        default_factory=dict, description="forks not compared, by reason (original_not_found, "
        "no_turn_t, other_seat, prefix_differs)")
    cosine: float | None = Field(description="mean cosine of the two turns' embeddings")
    cosine_ci_low: float | None
    cosine_ci_high: float | None
    words_simulated: float | None = Field(description="mean words of the simulator's turn")
    words_human: float | None = Field(description="mean words of the person's turn")
    politeness_simulated: float | None = Field(description="share with a politeness marker")
    politeness_human: float | None
    frustration_simulated: float | None = Field(description="share with a frustration marker")
    frustration_human: float | None
    examples: list[ForkExample] = Field(default_factory=list, description="up to 5")


class HumanMetrics(_Model):
    """Human-calibrated numbers (docs/evaluation.md, "Against people")."""

    reference: str | None = Field(description="the --reference run, or None (the run's own people)")
    n_human_run: int = Field(description="dialogues of the run with a person in a seat")
    n_human_reference: int = Field(description="dialogues of the reference with a person in a seat")
    splits: int = Field(description="random half-splits averaged for human_spread")
    stats: list[HumanRealismStat]
    calibration: JudgeCalibration | None = None
    forks: ForkComparison | None = Field(None, description="same-prefix comparison of forks")
    notes: list[str] = Field(default_factory=list)


class Metrics(_Model):
    """Everything ``spasm eval`` computes for one run directory."""

    schema_version: int = SCHEMA_VERSION
    run_dir: str
    created_at: str
    embedder: str
    mode: Literal["cheap", "probe"]
    judge: bool
    counts: Counts
    drift: DriftMetrics
    echoing: EchoingMetrics
    separability: list[SeparabilityGroup]
    separability_own: list[SeparabilityGroup] = Field(
        default_factory=list, description="the same groups on the Client's own content"
    )
    own_content: OwnContentMetrics | None = Field(None, description="the own-content rule and counts")
    realism: RealismMetrics | None = Field(None, description="lexical diversity and diagnostics")
    consistency: ConsistencyMetrics | None = Field(None, description="persona consistency (--consistency)")
    judges: JudgeEnsemble | None = Field(None, description="per-judge results (--judge-backend)")
    language: LanguageMetrics | None = Field(None, description="language compliance")
    goals: GoalMetrics | None = Field(None, description="goal success (runs with scenarios)")
    group: GroupMetrics | None = Field(None, description="role confusion (group runs)")
    reliability: ReliabilityMetrics | None = Field(None, description="pass^k (runs with trials)")
    payload_leak: PayloadLeakMetrics | None = Field(
        None, description="Client utterances repeating hidden tool payloads (runs with events)")
    simulator_errors: SimulatorErrorMetrics | None = Field(
        None, description="the simulated user's judged errors (--simulator-errors)")
    llm: LLMUsage | None = Field(None, description="probe/judge calls; null when no LLM was used")
    human: HumanMetrics | None = Field(
        None, description="simulator vs people and judge calibration (runs or references with people)")
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
