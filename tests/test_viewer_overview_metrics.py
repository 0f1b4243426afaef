"""The viewer's overview reads metrics.json through the metrics models: each table row keeps
the plain fields of its model (spasm.evaluation.metrics), so a field added there reaches the
overview's rows with no change to the viewer, and spasm's own metrics.json has no problem."""

from __future__ import annotations

import json

from spasm.evaluation.metrics import EchoRate, PairedComparison, SeparabilityGroup
from spasm.viewer.eval_view import readable_metrics

RATE = EchoRate(pairing="a/b", condition="ecp", n=4, n_echoing=1, rate=0.25, ci_low=0.05, ci_high=0.7,
                by_client=1)
PAIRED = PairedComparison(dimension="utterance", pairing="all", n_pairs=3, mean_ecp=0.2, mean_concat=0.4,
                          delta=-0.2, delta_ci_low=-0.3, delta_ci_high=-0.1, cohen_d=-1.5, p_ttest=0.04,
                          p_wilcoxon=0.25, note=None)
GROUP = SeparabilityGroup(pairing="a/b", condition="concat", n_conversations=6, n_personas=3,
                          silhouette=0.1, davies_bouldin=2.0, intra_mean=0.4, intra_sd=0.1,
                          retrieval="card", n_queries=6, acc_at_k=[0.5, 1.0], random_at_k=[0.33, 0.67],
                          note="few personas")


def test_the_overview_rows_are_the_plain_fields_of_the_metrics_models() -> None:
    raw = json.loads(json.dumps({
        "echoing": {"method": "rule", "rates": [RATE.model_dump(mode="json")]},
        "drift": {"comparisons": [PAIRED.model_dump(mode="json")]},
        "separability": [GROUP.model_dump(mode="json")],
    }))
    read = readable_metrics(raw)
    assert read.problems == []
    assert read.data is not None
    assert read.data["echoing"]["rates"] == [RATE.model_dump()]
    assert read.data["drift"]["comparisons"] == [PAIRED.model_dump()]
    # The lists (Acc@K and its baseline) are not table cells: every other field is kept.
    assert read.data["separability"] == [GROUP.model_dump(exclude={"acc_at_k", "random_at_k"})]
    # Only the shape the page reads is checked: a list where a cell belongs is named.
    raw["separability"][0]["note"] = ["not", "text"]
    read = readable_metrics(raw)
    assert read.problems == ["1 of 1 entries of separability are not in the expected form"]
    assert read.data is not None and read.data["separability"][0]["note"] is None
