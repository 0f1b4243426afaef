"""`spasm compare`: every metric per condition, paired by persona and seed, with effect
sizes, 95% intervals and Holm-corrected p-values; compare.json read back from disk."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from spasm.dataset.synthetic import write_run
from spasm.errors import UserError
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.compare import COMPARED_METRICS, compare_conditions, load_comparison
from spasm.evaluation.drift import DRIFT_DIMENSIONS
from spasm.evaluation.realism import REALISM_METRICS
from spasm.evaluation.stats import cohen_dz_interval, holm
from spasm.evaluation.testing import LookupEmbedder
from tests.eval_cli import eval_cli

register_embedder("lookup", LookupEmbedder)


def test_holm_adjusts_known_p_values() -> None:
    # Sorted 0.01, 0.03, 0.04 with m = 3: 3*0.01, max(0.03, 2*0.03), max(0.06, 1*0.04).
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_cohen_dz_interval_is_the_normal_approximation() -> None:
    low, high = cohen_dz_interval(0.5, 50)
    half = 1.959964 * math.sqrt(1 / 50 + 0.25 / 100)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)
    assert all(math.isnan(v) for v in cohen_dz_interval(0.5, 1))


def test_the_compared_columns_derived_from_the_drift_dimensions_are_the_list_as_it_was_spelled() -> None:
    """COMPARED_METRICS builds its drift_* and *_own names from DRIFT_DIMENSIONS; the order
    (the order of compare.json, of the report's forest plot and of ``spasm compare``) is the
    one the list had when it was spelled out."""
    assert DRIFT_DIMENSIONS == ("utterance", "concerns", "emotion", "motivation")
    spelled = (
        "drift_utterance", "drift_concerns", "drift_emotion", "drift_motivation",
        "drift_utterance_own", "drift_concerns_own", "drift_emotion_own", "drift_motivation_own",
        "persona_hit_at_1", "persona_hit_at_1_own", "persona_silhouette", "persona_silhouette_own",
        "echoing", "echo_score", *REALISM_METRICS,
        "consistency_prompt_to_line", "consistency_prompt_to_line_own", "consistency_line_to_line",
        "qa_consistency", "language_compliance_client", "language_compliance_responder", "goal_met",
        "payload_leak", "sim_critical",
        "group_impersonation", "group_impersonation_share", "group_echo", "group_echo_max",
        "group_silence", "group_silence_rate", "group_loop", "group_loop_longest",
        "group_drift_utterance", "group_drift_concerns", "group_drift_emotion", "group_drift_motivation",
        "group_drift_utterance_own", "group_drift_concerns_own", "group_drift_emotion_own",
        "group_drift_motivation_own",
    )
    assert spelled == COMPARED_METRICS
    assert len(set(COMPARED_METRICS)) == len(COMPARED_METRICS)


def _frame() -> pd.DataFrame:
    rows = []
    # x: ECP 1, 2, 3 vs CONCAT 0, 1, 1 -> differences 1, 1, 2; y: the same differences.
    # QUOTED only shares personas p0 and p1 with ECP; p2's QUOTED twin has another seed.
    for cond, xs, seeds in (
        ("ecp", [1, 2, 3], [7, 8, 9]),
        ("concat", [0, 1, 1], [7, 8, 9]),
        ("quoted", [1, 2, 0], [7, 8, 99]),
    ):
        for i, (x, seed) in enumerate(zip(xs, seeds, strict=True)):
            rows.append(
                {
                    "dialogue_id": f"p{i}-{cond}",
                    "persona_id": f"p{i}",
                    "conversation_index": 0,
                    "seed": seed,
                    "pairing": "a/b",
                    "condition": cond,
                    "harness_level": "A",
                    "drift_utterance": float(x),
                    "mattr_client": float(x) / 10,
                }
            )
    return pd.DataFrame(rows)


def test_paired_contrast_of_a_known_set() -> None:
    c = compare_conditions(_frame())
    assert c.baseline == "ecp" and c.conditions == ["ecp", "concat", "quoted"]
    assert c.metrics == ["drift_utterance", "mattr_client"]
    by = {(x.condition, x.metric): x for x in c.contrasts if x.baseline == "ecp"}
    d = by[("concat", "drift_utterance")]
    assert d.n_pairs == 3 and d.delta == pytest.approx(4 / 3)
    # sd of (1, 1, 2) = sqrt(1/3), so d_z = (4/3) / sqrt(1/3) and t = d_z * sqrt(3) = 4;
    # with 2 degrees of freedom the two-sided p is 1 - t / sqrt(2 + t^2).
    assert d.effect_size == pytest.approx((4 / 3) / math.sqrt(1 / 3))
    assert d.p_ttest == pytest.approx(1 - 4 / math.sqrt(18))
    # Both metrics have the same p, so Holm multiplies the smaller by 2 and keeps the max.
    assert d.p_holm == pytest.approx(2 * d.p_ttest)
    assert by[("concat", "mattr_client")].p_holm == pytest.approx(d.p_holm)
    assert d.effect_ci_low is not None and d.effect_ci_low < d.effect_size < (d.effect_ci_high or 0)
    # QUOTED pairs only on the two keys it shares with ECP (seed 99 has no twin).
    q = by[("quoted", "drift_utterance")]
    assert q.n_pairs == 2 and q.delta == 0.0 and q.note
    # Every pair is reported: CONCAT − QUOTED too (on the same two keys: 0−1, 1−2).
    assert [(x.baseline, x.condition) for x in c.contrasts if x.metric == "drift_utterance"] == [
        ("ecp", "concat"), ("ecp", "quoted"), ("concat", "quoted")]
    cq = next(x for x in c.contrasts if (x.baseline, x.condition, x.metric)
              == ("concat", "quoted", "drift_utterance"))
    assert cq.n_pairs == 2 and cq.delta == pytest.approx(-1.0)
    means = {(m.metric, m.condition): m.mean for m in c.means}
    assert means[("drift_utterance", "quoted")] == pytest.approx(1.0)


def test_baseline_can_be_chosen_and_must_exist() -> None:
    c = compare_conditions(_frame(), baseline="concat")
    assert c.baseline == "concat" and {x.condition for x in c.contrasts} == {"ecp", "quoted"}
    assert next(x for x in c.contrasts if x.condition == "ecp").delta == pytest.approx(-4 / 3)
    with pytest.raises(UserError, match="not a condition"):
        compare_conditions(_frame(), baseline="nope")


def test_one_condition_has_nothing_to_pair() -> None:
    c = compare_conditions(_frame().query("condition == 'ecp'"))
    assert c.contrasts == [] and "nothing to pair" in c.notes[0]


# --------------------------------------------------------------------------- end to end


def _run(tmp_path: Path) -> Path:
    personas = [{"persona_id": f"p{i}", "card": f"Persona {i} fixes bikes."} for i in range(4)]
    dialogues = []
    for i in range(4):
        for cond, polite in (("ecp", False), ("concat", True)):
            client = [f"My bike number {i} squeaks", "It squeaks on hills", "And when braking"]
            if polite:
                client = [f"Please, could you help? {c}" for c in client]
            texts = [t for c in client for t in (c, f"Helper reply to bike {i}.")]
            did = f"p{i}-{cond}"
            dialogues.append(
                {"dialogue_id": did, "persona_id": f"p{i}", "condition": cond, "seed": i, "texts": texts}
            )
    return write_run(tmp_path / "run", personas, dialogues)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The constructed run, evaluated once for the tests that only read its evaluation."""
    run = _run(tmp_path_factory.mktemp("compare"))
    evaluate(run, embedder="lookup", progress=False)
    return run


def test_eval_writes_compare_json_and_a_forest_plot(evaluated: Path) -> None:
    run = evaluated
    saved = load_comparison(run / "eval" / "compare.json")
    polite = next(c for c in saved.contrasts if c.metric == "politeness_client" and c.pairing == "all")
    # Every CONCAT Client turn is polite, no ECP one is: Δ = 0 − 1 for all four pairs.
    assert polite.n_pairs == 4 and polite.delta == pytest.approx(-1.0)
    assert polite.note == "all paired differences are equal: no test"
    assert saved.pair_key == ["pairing", "persona_id", "conversation_index", "seed", "harness_level"]
    html = (run / "eval" / "report.html").read_text()
    assert "Every metric, paired" in html and "forest" in html.lower()


@pytest.mark.e2e
def test_compare_cli_prints_every_metric_and_writes_compare_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path)
    assert eval_cli(["compare", str(run), "--embedder", "lookup", "--no-progress",
                     "--baseline", "concat"]) == 0
    out = capsys.readouterr().out
    assert "Every metric, paired" in out and "concat − ecp" in out and "politeness_client" in out
    data = json.loads((run / "eval" / "compare.json").read_text())
    assert data["baseline"] == "concat" and data["correction"] == "holm"


def test_compare_cli_rejects_an_unknown_baseline(evaluated: Path) -> None:
    with pytest.raises(UserError, match="not a condition"):
        eval_cli(["compare", str(evaluated), "--embedder", "lookup", "--baseline", "nope"])
