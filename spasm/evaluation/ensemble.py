"""Judge ensembles: several LLM judges on one metric, their agreement and where they differ.

Every LLM-judged metric (the echoing judge, persona consistency) can be judged by several
backends (``--judge-backend A --judge-backend B``). spasm reports each judge's result, the
agreement between them — Fleiss' κ over the items every judge labelled (a dialogue for
echoing; a Client line for consistency), which is Cohen's κ-like for two judges and defined
for any number — and lists the items they disagree on. The ensemble's echoing verdict is the
judges' majority (a tie keeps the rule's verdict); a dialogue's consistency score is the mean
of every judge's labels.

NeMo User Sim requires its judges to span two model families, since judges of one family share
blind spots; spasm warns when they do not. The family is read from the model name
(:func:`model_family`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from spasm.evaluation.agreement import fleiss_kappa
from spasm.evaluation.echoing import EchoVerdict
from spasm.evaluation.metrics import JudgeAgreement, JudgeDisagreement

__all__ = [
    "DISAGREEMENTS_LISTED",
    "agreement",
    "family_warning",
    "line_labels",
    "majority_echoing",
    "model_family",
]

#: At most this many disagreements per metric are listed in metrics.json (all are counted).
DISAGREEMENTS_LISTED = 50

# First match wins; the families of the models people judge with.
_FAMILIES: tuple[tuple[str, str], ...] = (
    (r"gpt|chatgpt|\bo[134]\b|o[134]-|davinci|openai", "openai"),
    (r"claude|anthropic", "anthropic"),
    (r"gemini|gemma|palm|google", "google"),
    (r"llama|meta-", "meta"),
    (r"qwen|qwq", "qwen"),
    (r"deepseek", "deepseek"),
    (r"mi[sx]tral|ministral|codestral", "mistral"),
    (r"\bphi[-\d]|phi-", "microsoft"),
    (r"smollm", "smollm"),
    (r"command|cohere|aya", "cohere"),
    (r"grok", "xai"),
    (r"nemotron|nvidia", "nvidia"),
    (r"granite", "ibm"),
    (r"glm|chatglm", "zhipu"),
    (r"\byi-|01-ai", "01-ai"),
)


def model_family(model: str, kind: str = "") -> str:
    """The model family of a judge, from its model name (``kind`` ``embedded`` is SmolLM2).

    Unknown names give their first word (``"foo-7b"`` -> ``"foo"``), so two unknown models of
    different names count as different families.
    """
    if kind == "embedded":
        return "smollm"
    name = model.lower().rsplit("/", 1)[-1] if "/" in model else model.lower()
    for pattern, family in _FAMILIES:
        if re.search(pattern, name):
            return family
    return re.split(r"[-_:.\s]", name, maxsplit=1)[0] or "unknown"


def family_warning(families: Mapping[str, str]) -> str | None:
    """A warning when the judges (name -> family) span fewer than two model families."""
    found = sorted(set(families.values()))
    if len(found) >= 2:
        return None
    which = found[0] if found else "none"
    return (
        f"All judges ({', '.join(families) or 'none'}) are of one model family ({which}); judges "
        "of one family share blind spots, and NeMo User Sim requires two. Add a judge of another "
        "family with --judge-backend."
    )


def majority_echoing(
    rule: Mapping[str, EchoVerdict], per_judge: Mapping[str, Mapping[str, EchoVerdict]]
) -> dict[str, EchoVerdict]:
    """The ensemble's echoing verdict per dialogue: the judges' majority, a tie keeping the rule.

    With one judge this is that judge's verdicts.
    """
    judges = list(per_judge)
    if len(judges) == 1:
        return dict(per_judge[judges[0]])
    out: dict[str, EchoVerdict] = {}
    for did, rule_verdict in rule.items():
        votes = [per_judge[j][did] for j in judges if did in per_judge[j]]
        yes = [v for v in votes if v.echoing]
        if 2 * len(yes) > len(votes):
            whos = [v.who for v in yes]
            who = max(set(whos), key=lambda w: (whos.count(w), w == rule_verdict.who))
            first = next(v for v in yes if v.who == who)
            out[did] = EchoVerdict(
                did, True, who, len(yes) / len(votes), rule_verdict.client_score,
                rule_verdict.responder_score, first.evidence, "judge", rule_verdict.turns,
            )
        elif 2 * len(yes) < len(votes):
            out[did] = EchoVerdict(
                did, False, "none", len(yes) / len(votes), rule_verdict.client_score,
                rule_verdict.responder_score, [], "judge", rule_verdict.turns,
            )
        else:
            out[did] = rule_verdict
    return out


def agreement(
    metric: str, labels: Mapping[str, Mapping[str, object]]
) -> tuple[JudgeAgreement, list[JudgeDisagreement]]:
    """Fleiss' κ of the judges (name -> {item: label}) on the items all of them labelled,
    and those items where they differ."""
    judges = list(labels)
    common = sorted(set.intersection(*(set(v) for v in labels.values()))) if judges else []
    categories = sorted({str(labels[j][i]) for j in judges for i in common})
    kappa: float | None = None
    if len(judges) >= 2 and common and categories:
        counts = np.zeros((len(common), len(categories)))
        for r, item in enumerate(common):
            for j in judges:
                counts[r, categories.index(str(labels[j][item]))] += 1
        kappa = fleiss_kappa(counts)
    disagreements = [
        JudgeDisagreement(metric=metric, item=item, labels={j: str(labels[j][item]) for j in judges})
        for item in common
        if len({str(labels[j][item]) for j in judges}) > 1
    ]
    return (
        JudgeAgreement(
            metric=metric,
            statistic="fleiss",
            n_judges=len(judges),
            n_items=len(common),
            kappa=kappa,
            n_disagreements=len(disagreements),
            agreement=1 - len(disagreements) / len(common) if common else None,
        ),
        disagreements,
    )


def line_labels(verdicts: Mapping[str, Sequence[int] | None], start: int = 0) -> dict[str, int]:
    """Flatten per-dialogue line labels to items ``<dialogue_id>#<client line>`` for agreement
    (``start``: the Client line the first label is about)."""
    return {
        f"{did}#{start + k}": int(v)
        for did, labels in verdicts.items()
        if labels
        for k, v in enumerate(labels)
    }
