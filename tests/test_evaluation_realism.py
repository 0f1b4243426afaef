"""Realism: MATTR, Yule's K, HD-D and the Client diagnostics on hand-made data with values
worked out by hand, and the z-scores against a reference run read back from Parquet."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pandas as pd
import pytest

from spasm.dataset.synthetic import write_run
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.diagnostics import (
    front_loading,
    frustration_fraction,
    politeness_fraction,
    verbosity_cv,
)
from spasm.evaluation.lexical import hdd, hdd_many, mattr, word_tokens, yules_k
from spasm.evaluation.testing import LookupEmbedder

register_embedder("lookup", LookupEmbedder)


# ------------------------------------------------------------------------------ lexical


def test_mattr_of_a_known_sequence() -> None:
    # Windows of 3 over a b a c b a: {a,b}=2/3, {b,a,c}=1, {a,c,b}=1, {c,b,a}=1 -> 11/12.
    assert mattr(["a", "b", "a", "c", "b", "a"], window=3) == pytest.approx(11 / 12)
    # Ten words cycled 60 times: every window of 50 holds exactly the ten types -> 10/50.
    assert mattr([f"w{i % 10}" for i in range(60)]) == pytest.approx(0.2)
    assert mattr([f"w{i}" for i in range(120)]) == 1.0


def test_mattr_of_a_text_shorter_than_the_window_is_its_ttr() -> None:
    assert mattr(["a", "a", "b"]) == pytest.approx(2 / 3)
    assert mattr([]) is None


def test_mattr_equals_the_average_over_explicit_windows() -> None:
    def by_definition(tokens: list[str], w: int) -> float:
        if len(tokens) <= w:
            return len(set(tokens)) / len(tokens)
        ttrs = [len(set(tokens[i : i + w])) / w for i in range(len(tokens) - w + 1)]
        return sum(ttrs) / len(ttrs)

    rng = random.Random(3)
    for _ in range(300):
        tokens = [rng.choice("abcdefgh") for _ in range(rng.randint(1, 90))]
        w = rng.randint(1, 25)
        assert mattr(tokens, w) == pytest.approx(by_definition(tokens, w), abs=1e-12)


def test_yules_k_of_known_count_vectors() -> None:
    # N = 6, sum f^2 = 9 + 4 + 1 = 14: K = 1e4 * (14 - 6) / 36.
    assert yules_k([3, 2, 1]) == pytest.approx(1e4 * 8 / 36)
    assert yules_k([1, 1, 1, 1]) == 0.0  # no word repeats
    assert yules_k([]) is None
    # "the" three times, three hapaxes: N = 6, sum f^2 = 12 -> 1e4 * 6 / 36.
    counts = pd.Series(word_tokens("The cat, the dog: THE end.")).value_counts().tolist()
    assert yules_k(counts) == pytest.approx(1e4 * 6 / 36)


def test_hdd_of_known_texts() -> None:
    # Sample of 2 from "a a b": a is always drawn (P = 1), b with P = 1 - C(2,2)/C(3,2) = 2/3.
    assert hdd(["a", "a", "b"], sample_size=2) == pytest.approx((1 + 2 / 3) / 2)
    # 42 tokens: the sample is the whole text, so HD-D is its TTR.
    assert hdd([f"w{i}" for i in range(42)]) == pytest.approx(1.0)
    assert hdd([f"w{i % 21}" for i in range(42)]) == pytest.approx(0.5)
    # 84 tokens, 42 types twice each: P(absent) = C(82,42)/C(84,42) = 42*41/(84*83).
    assert hdd([f"w{i % 42}" for i in range(84)]) == pytest.approx(1 - 42 * 41 / (84 * 83))
    assert hdd([f"w{i}" for i in range(41)]) is None  # fewer tokens than the sample


def test_hdd_many_matches_one_at_a_time_across_chunks() -> None:
    rng = random.Random(5)
    texts = [[rng.choice("abcdefghijklmnop") for _ in range(rng.randint(30, 120))] for _ in range(40)]
    counts = [pd.Series(t).value_counts().tolist() for t in texts]
    assert hdd_many(counts) == [pytest.approx(hdd(t)) if len(t) >= 42 else None for t in texts]


def test_tokens_ignore_case_and_punctuation_and_keep_contractions() -> None:
    assert word_tokens("Don\u2019t STOP, don't stop!") == ["don't", "stop", "don't", "stop"]


# -------------------------------------------------------------------------- diagnostics


def test_front_loading_is_the_share_of_content_words_given_in_turn_zero() -> None:
    turns = ["My printer jams every morning", "It jams again", "The printer is old and jams"]
    # Content words: {printer, jams, every, morning} in turn 0, "old" only later: 4/5.
    assert front_loading(turns) == pytest.approx(4 / 5)
    assert front_loading(["Everything at once, in one message"]) is None  # one turn: undefined


def test_politeness_and_frustration_are_shares_of_client_turns() -> None:
    polite = ["Please help", "Thanks a lot", "My printer is broken"]
    frustrated = ["I already told you that", "ok", "This is ridiculous!!"]
    assert politeness_fraction(polite) == pytest.approx(2 / 3)
    assert frustration_fraction(frustrated) == pytest.approx(2 / 3)
    assert frustration_fraction(["You should fix it", "Fine, thank you"]) == 0.0
    assert politeness_fraction([]) is None


def test_verbosity_cv_is_population_sd_over_mean_of_turn_lengths() -> None:
    # Lengths 2, 4, 6: mean 4, population sd sqrt(8/3).
    assert verbosity_cv(["a b", "a b c d", "a b c d e f"]) == pytest.approx(math.sqrt(8 / 3) / 4)
    from scipy.stats import variation  # the reference; scipy loads only for this test

    assert verbosity_cv(["a b", "a b c d", "a b c d e f"]) == pytest.approx(variation([2, 4, 6]))
    assert verbosity_cv(["same length", "same length"]) == 0.0
    assert verbosity_cv(["only one"]) is None


# ------------------------------------------------------------- end to end, with a reference

_PERSONAS = [{"persona_id": f"p{i}", "card": f"Persona {i}."} for i in range(3)]


def _dialogue(pid: str, condition: str, k: int, texts: list[str]) -> dict[str, object]:
    return {
        "dialogue_id": f"{pid}-{condition}",
        "persona_id": pid,
        "condition": condition,
        "seed": 100 + k,
        "texts": texts,
    }


def _texts(client: list[str]) -> list[str]:
    out: list[str] = []
    for i, c in enumerate(client):
        out += [c, f"Reply number {i} from the helper about it."]
    return out


@pytest.mark.e2e
def test_eval_writes_realism_values_and_z_scores_against_a_reference(tmp_path: Path) -> None:
    # Reference: the Client's politeness is 0, 1/2, 1 across three dialogues (mean 1/2, sd 1/2).
    ref_clients = [
        ["My bike chain slipped", "It slipped on the hill"],
        ["Please look at my bike", "The gears click"],
        ["Please check the brakes", "Thanks, and the bell please"],
    ]
    reference = write_run(
        tmp_path / "reference",
        _PERSONAS,
        [_dialogue(f"p{i}", "ecp", i, _texts(c)) for i, c in enumerate(ref_clients)],
    )
    run_clients = {
        "ecp": [["Please fix it", "Thanks"], ["Hello there", "Please hurry"], ["Hi", "Bye"]],
        "concat": [["Please fix it", "Thanks please"], ["Please", "Thanks"], ["Please", "Thank you"]],
    }
    dialogues = [
        _dialogue(f"p{i}", cond, i, _texts(c)) for cond, cs in run_clients.items() for i, c in enumerate(cs)
    ]
    run = write_run(tmp_path / "run", _PERSONAS, dialogues)

    m = evaluate(run, embedder="lookup", reference=reference, progress=False)

    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    assert per.loc["p0-ecp", "politeness_client"] == 1.0
    assert per.loc["p2-ecp", "politeness_client"] == 0.0
    # z = (value - 1/2) / (1/2)
    assert per.loc["p0-ecp", "politeness_client_z"] == pytest.approx(1.0)
    assert per.loc["p2-ecp", "politeness_client_z"] == pytest.approx(-1.0)
    assert per.loc["p1-ecp", "politeness_client_z"] == pytest.approx(0.0)
    assert {"mattr_client", "yules_k_responder", "hdd_client", "verbosity_cv_client"} <= set(per)

    assert m.realism is not None and m.realism.reference is not None
    assert m.realism.reference.dialogues == 3
    ref = {s.metric: s for s in m.realism.reference.stats}
    assert ref["politeness_client"].mean == pytest.approx(0.5)
    assert ref["politeness_client"].sd == pytest.approx(0.5)
    stats = {(s.metric, s.condition): s for s in m.realism.stats}
    assert stats[("politeness_client", "ecp")].mean == pytest.approx(0.5)  # (1 + 1/2 + 0) / 3
    assert stats[("politeness_client", "ecp")].mean_z == pytest.approx(0.0)
    assert stats[("politeness_client", "concat")].mean_z == pytest.approx(1.0)
    # HD-D needs 42 words: these short sides have none, and a note says why.
    assert stats[("hdd_client", "all")].n == 0 and stats[("hdd_client", "all")].mean is None
    assert any("under 50 words" in n for n in m.realism.notes)

    saved = json.loads((run / "eval" / "metrics.json").read_text())
    assert saved["realism"]["reference"]["run_dir"] == str(reference)
    assert "politeness_client" in saved["realism"]["definitions"]


def test_eval_without_a_reference_reports_values_only(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run", _PERSONAS[:1], [_dialogue("p0", "ecp", 0, _texts(["Please help", "Thanks"]))]
    )
    m = evaluate(run, embedder="lookup", progress=False)
    assert m.realism is not None and m.realism.reference is None
    assert all(s.mean_z is None for s in m.realism.stats)
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert not [c for c in per if c.endswith("_z")]


def test_a_reference_that_is_not_a_directory_is_a_user_error(tmp_path: Path) -> None:
    from spasm.errors import UserError

    run = write_run(tmp_path / "run", _PERSONAS[:1], [_dialogue("p0", "ecp", 0, _texts(["Hi", "Bye"]))])
    with pytest.raises(UserError, match="not a directory"):
        evaluate(run, embedder="lookup", reference=tmp_path / "missing", write=False, progress=False)
