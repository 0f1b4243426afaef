"""Reliability of a run with trials: pass^k and the noise floor (tests/test_trials.py).

A run with ``trials: K`` runs every planned dialogue K times with its own seed per trial
(``dialogues.trial``). The dialogues that differ only in their trial are one *task* (the same
persona, conversation, scenario, pairing, condition and harness level); a dialogue's outcome
is its ``reward`` when the run has one (success: a reward of 1, as τ² counts it), else the goal
judge's ``goal_met`` (:attr:`~spasm.evaluation.loader.Conversation.outcome`). A trial without
an outcome (no verdict) is left out of its task and counted as ``undecided``; a dialogue that
failed is not in the evaluation at all, so its task has fewer trials.

pass^k, the chance that k trials of a task all succeed, is reported for k = 1..K by two
estimators, both named in ``metrics.json``:

* ``unbiased``: τ-bench's, the mean over tasks of C(c, k) / C(n, k) (c successes of n
  trials): every k-subset of a task's trials counts, so it uses all the data;
* ``all_of_k``: the trials of each task split, in trial order, into ⌊n/k⌋ disjoint groups of
  k; the share of groups whose k trials all succeed (pooled over tasks). Also unbiased, with
  more variance, but what "run it k times and count the times every run passed" means
  literally (tau2-bench #497 asks which of the two a figure used).

Tasks with fewer than k decided trials are left out of pass^k for that k (``tasks`` says how
many were used). The noise floor says what a difference between two runs can mean
(tau2-bench #540): ``flip_share`` is the share of tasks with two or more decided trials whose
outcome differs between trials, and ``noise_floor`` (per k) the smallest difference two runs
of this size can show, by bootstrap: each replicate draws the tasks with replacement and each
drawn task's trials with replacement (a binomial draw of its successes), two replicates are
compared, and the 95th percentile of their absolute pass^k difference is the floor: two runs
of the same system differ by less than that 95% of the time, so a smaller difference between
conditions or models says nothing. Replicates use a fixed seed (the same run gives the same
floor).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import PassHatK, ReliabilityMetrics, ReliabilityRow
from spasm.registry import condition_rank

__all__ = ["BOOTSTRAP_REPLICATES", "ESTIMATORS", "pass_hat_all_of_k", "pass_hat_unbiased",
           "reliability_metrics"]

#: Bootstrap replicates of the noise floor (two runs are drawn per comparison).
BOOTSTRAP_REPLICATES = 1000
#: The share of run-to-run differences the floor covers.
CONFIDENCE = 0.95
_SEED = 20260
#: The estimators, as metrics.json and the report name and define them.
ESTIMATORS: dict[str, str] = {
    "unbiased": "mean over tasks of C(c,k)/C(n,k), c successes in n trials (tau-bench's)",
    "all_of_k": ("share of disjoint groups of k consecutive trials (in trial order, "
                 "floor(n/k) per task) whose k trials all succeed"),
}


@dataclass
class _Task:
    """One planned dialogue's trials: outcomes in trial order (decided ones only)."""

    outcomes: list[bool] = field(default_factory=list)
    undecided: int = 0


def pass_hat_unbiased(tasks: Sequence[Sequence[bool]], k: int) -> tuple[float | None, int]:
    """``(mean C(c,k)/C(n,k) over tasks with n >= k, how many tasks)``; ``None`` without any."""
    used = [t for t in tasks if len(t) >= k]
    if not used:
        return None, 0
    values = [math.comb(sum(t), k) / math.comb(len(t), k) for t in used]
    return float(np.mean(values)), len(used)


def pass_hat_all_of_k(tasks: Sequence[Sequence[bool]], k: int) -> tuple[float | None, int]:
    """``(share of all-success groups, how many groups)``: each task's trials cut in order into
    ⌊n/k⌋ disjoint groups of k; ``None`` when no task has k trials."""
    passed = groups = 0
    for t in tasks:
        for g in range(len(t) // k):
            groups += 1
            passed += all(t[g * k:(g + 1) * k])
    return (passed / groups if groups else None), groups


def _noise_floor(tasks: Sequence[Sequence[bool]], ks: Sequence[int],
                 rng: np.random.Generator) -> list[float | None]:
    """Per k: the 95th percentile of |pass^k(run a) − pass^k(run b)| over pairs of runs of the
    same tasks, each task's successes in each run drawn binomially from its own success rate
    and trial count (its trials drawn again with replacement). ``None`` for a k no task
    reaches. Replicates go in blocks, so memory stays near ``block × tasks`` whatever the run."""
    n = np.array([len(t) for t in tasks], dtype=np.int64)
    c = np.array([sum(t) for t in tasks], dtype=np.int64)
    if not len(tasks):
        return [None for _ in ks]
    p = c / n
    top = int(n.max())
    # table[k, n, c] = C(c, k) / C(n, k): pass^k of a task with c successes in n trials.
    table = np.zeros((max(ks) + 1, top + 1, top + 1))
    for k in ks:
        for trials in range(k, top + 1):
            table[k, trials, : trials + 1] = [math.comb(x, k) / math.comb(trials, k)
                                              for x in range(trials + 1)]
    diffs: dict[int, list[np.ndarray]] = {k: [] for k in ks}
    block = max(1, min(BOOTSTRAP_REPLICATES, 2_000_000 // max(1, len(tasks))))
    done = 0
    while done < BOOTSTRAP_REPLICATES:
        reps = min(block, BOOTSTRAP_REPLICATES - done)
        a = rng.binomial(n, p, size=(reps, len(tasks)))
        b = rng.binomial(n, p, size=(reps, len(tasks)))
        for k in ks:
            usable = n >= k
            if not usable.any():
                continue
            rows = n[usable]
            va = table[k, rows, a[:, usable]].mean(axis=1)
            vb = table[k, rows, b[:, usable]].mean(axis=1)
            diffs[k].append(np.abs(va - vb))
        done += reps
    return [float(np.quantile(np.concatenate(diffs[k]), CONFIDENCE)) if diffs[k] else None
            for k in ks]


def _row(pairing: str, condition: str, scenario: str, tasks: Sequence[_Task], k_max: int,
         rng: np.random.Generator) -> ReliabilityRow:
    decided = [t.outcomes for t in tasks if t.outcomes]
    ks = list(range(1, k_max + 1))
    floor = _noise_floor(decided, ks, rng)
    pass_hat = []
    for k, f in zip(ks, floor, strict=True):
        unbiased, used = pass_hat_unbiased(decided, k)
        all_of_k, groups = pass_hat_all_of_k(decided, k)
        pass_hat.append(PassHatK(k=k, unbiased=unbiased, all_of_k=all_of_k, tasks=used,
                                 groups=groups, noise_floor=f))
    repeated = [t for t in decided if len(t) >= 2]
    flipped = sum(1 for t in repeated if len(set(t)) > 1)
    return ReliabilityRow(
        pairing=pairing, condition=condition, scenario_id=scenario, tasks=len(tasks),
        trials=max((len(t.outcomes) + t.undecided for t in tasks), default=0),
        dialogues=sum(len(t.outcomes) + t.undecided for t in tasks),
        undecided=sum(t.undecided for t in tasks),
        successes=sum(sum(t) for t in decided),
        pass_hat=pass_hat, flipped=flipped,
        flip_share=flipped / len(repeated) if repeated else None,
    )


def reliability_metrics(conversations: Sequence[Conversation]) -> ReliabilityMetrics | None:
    """pass^k and the noise floor per condition (all pairings and scenarios: the overall
    figure), per pairing × condition when the run has several pairings, and per scenario ×
    condition; ``None`` for a run without trials. A run with trials but no outcome (neither
    rewards nor scenarios) gets the counts and a note instead of numbers."""
    convs = [c for c in conversations if c.trial is not None]
    if not convs:
        return None
    rewards = any(c.reward is not None for c in convs)
    outcome = "reward" if rewards else "goal_met"
    tasks: dict[tuple[str, str, str, str, int, str, str], _Task] = defaultdict(_Task)
    for c in sorted(convs, key=lambda c: c.trial or 0):
        key = (c.pairing, c.condition, c.harness_level, c.persona_id, c.conversation_index,
               str(c.scenario_id), c.dialogue_id.rsplit("-t", 1)[0])
        task = tasks[key]
        if c.outcome is None:
            task.undecided += 1
        else:
            task.outcomes.append(c.outcome)
    k_max = max(c.trial or 0 for c in convs) + 1
    pairings = {key[0] for key in tasks}
    groups: dict[tuple[str, str, str], list[_Task]] = defaultdict(list)
    for key, task in tasks.items():
        pairing, condition, scenario = key[0], key[1], key[5]
        groups[("all", condition, "all")].append(task)
        if len(pairings) > 1:
            groups[(pairing, condition, "all")].append(task)
        if scenario != "None":
            groups[("all", condition, scenario)].append(task)
    rng = np.random.default_rng(_SEED)
    rows = [
        _row(pairing, condition, scenario, members, k_max, rng)
        for (pairing, condition, scenario), members in sorted(
            groups.items(), key=lambda kv: (kv[0][2] != "all", kv[0][2], kv[0][0] != "all",
                                            kv[0][0], *condition_rank(kv[0][1])))
    ]
    notes = []
    undecided = sum(t.undecided for t in tasks.values())
    if undecided:
        notes.append(f"{undecided} of {len(convs)} dialogues have no {outcome} (no verdict): "
                     "left out of their task's trials.")
    if not any(t.outcomes for t in tasks.values()):
        notes.append("No dialogue has an outcome: pass^k needs a reward (tool scenarios with "
                     "success:) or a goal verdict (scenarios: with the goal judge on).")
    short = sum(1 for t in tasks.values() if 0 < len(t.outcomes) < k_max)
    if short:
        notes.append(f"{short} of {len(tasks)} tasks have fewer than {k_max} decided trials "
                     "(failed or undecided dialogues): each pass^k uses the tasks that reach k.")
    return ReliabilityMetrics(
        outcome=outcome, trials=k_max, tasks=len(tasks), estimators=ESTIMATORS,
        bootstrap_replicates=BOOTSTRAP_REPLICATES, confidence=CONFIDENCE, rows=rows,
        notes=notes,
    )
