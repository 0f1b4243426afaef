"""`spasm eval` against people: each realism metric for the simulator and for people side by
side with the human-human spread as its ceiling (a --reference of imported conversations, or
people within the run), and the goal judge calibrated against the person's own verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from spasm.dataset.importer import import_conversations, import_spasm_jsonl
from spasm.dataset.rows import ScenarioDialogueRow, TurnRow, human_row_model
from spasm.dataset.store import RunStore, write_finished_run
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.human import SPLITS
from spasm.evaluation.testing import LookupEmbedder

register_embedder("lookup", LookupEmbedder)
SAMPLE = Path(__file__).parent / "data" / "spasm_release_sample.jsonl"
ROOT = Path(__file__).resolve().parent.parent

PEOPLE_LINES = [
    ["hey so my order never came", "ugh its been two weeks, I already told you the number"],
    ["Hello. I would like to cancel my subscription please.", "Thanks, that is all."],
    ["is the shop open sunday", "ok"],
    ["My invoice is wrong: you charged me twice for the same lamp.", "Seriously? Still not fixed."],
    ["can i change the delivery address", "great thank you so much"],
    ["Hi", "The blue one. Or the green, I cannot decide, what would you pick for a small room?"],
]


def _people(tmp_path: Path) -> Path:
    src = tmp_path / "people.jsonl"
    records = []
    for k, lines in enumerate(PEOPLE_LINES):
        messages: list[dict[str, Any]] = []
        for line in lines:
            messages += [{"role": "user", "content": line},
                         {"role": "assistant", "content": f"Answer {k} to: {line}"}]
        records.append({"id": f"h{k}", "user": f"u{k}", "messages": messages})
    src.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    import_conversations(src, tmp_path / "people")
    return tmp_path / "people"


def _spread(values: np.ndarray) -> float:
    rng = np.random.default_rng(20260126)
    half = len(values) // 2
    gaps = []
    for _ in range(SPLITS):
        o = rng.permutation(len(values))
        gaps.append(abs(values[o[:half]].mean() - values[o[half:2 * half]].mean()))
    return float(np.mean(gaps))


def test_a_reference_of_imported_people_is_the_ceiling_of_every_realism_metric(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    import_spasm_jsonl(SAMPLE, sim)
    ref = _people(tmp_path)
    m = evaluate(sim, embedder="lookup", reference=ref, progress=False)
    assert m.human is not None and m.human.n_human_run == 0 and m.human.n_human_reference == 6
    by = {(s.metric, s.condition): s for s in m.human.stats}
    sim_frame = pd.read_parquet(sim / "eval" / "per_dialogue.parquet")
    evaluate(ref, embedder="lookup", progress=False)
    ref_frame = pd.read_parquet(ref / "eval" / "per_dialogue.parquet")
    assert ("mattr_responder", "all") not in by  # no person sat in the responder seat
    for metric in ("mattr_client", "politeness_client", "yules_k_client"):
        s = by[(metric, "all")]
        sims = sim_frame[metric].dropna().to_numpy()
        people = ref_frame[metric].dropna().to_numpy()
        assert (s.n_simulated, s.n_human) == (len(sims), len(people)) == (3, 6)
        assert s.simulated_mean == pytest.approx(sims.mean())
        assert s.human_mean == pytest.approx(people.mean())
        assert s.gap == pytest.approx(sims.mean() - people.mean())
        assert s.human_spread == pytest.approx(_spread(people))
        assert s.gap_over_spread == pytest.approx(abs(s.gap) / s.human_spread)
    # Per condition of the simulated dialogues, against the same people.
    assert by[("mattr_client", "concat")].n_simulated == 1
    metrics = json.loads((sim / "eval" / "metrics.json").read_text())
    assert metrics["human"]["stats"][0]["metric"] == "mattr_client"
    report = (sim / "eval" / "report.html").read_text()
    assert "Against people" in report and "human–human spread" in report
    # The z-scores against the same reference are those the realism stage always gave.
    assert m.realism is not None and m.realism.reference is not None


def test_a_run_without_people_has_no_human_section(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    import_spasm_jsonl(SAMPLE, sim)
    m = evaluate(sim, embedder="lookup", write=False, progress=False)
    assert m.human is None
    other = tmp_path / "other"
    import_spasm_jsonl(SAMPLE, other)
    assert evaluate(sim, embedder="lookup", reference=other, write=False, progress=False).human is None


def _dialogue(did: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"dialogue_id": did, "persona_id": "p0", "conversation_index": int(did[1:]),
            "condition": "ecp", "pairing": "human×m" if kind == "human" else "m/m",
            "client_backend": "b", "client_model": "m", "responder_backend": "b",
            "responder_model": "m", "seed": 0, "n_utterances": 2, "termination_reason": "natural",
            "client_kind": kind, "responder_kind": "llm", **extra}


def _turns(did: str, client: str) -> list[dict[str, Any]]:
    return [{"dialogue_id": did, "turn_index": 0, "speaker": "client", "text": client},
            {"dialogue_id": did, "turn_index": 1, "speaker": "responder", "text": "Sure, done."}]


def test_people_within_the_run_itself_are_the_reference(tmp_path: Path) -> None:
    dialogues, turns = [], []
    for k, lines in enumerate(PEOPLE_LINES):
        dialogues.append(_dialogue(f"d{k}", "human", operator=f"op-{k:06d}", interface="web"))
        turns += _turns(f"d{k}", " ".join(lines))
    for k in range(6, 10):
        dialogues.append(_dialogue(f"d{k}", "llm"))
        turns += _turns(f"d{k}", "Hello! I hope you are well. I would like some help with my order.")
    persona = {"persona_id": "p0", "persona_index": 0, "card": "A person."}
    write_finished_run(tmp_path / "mixed", {"personas": [persona], "dialogues": dialogues,
                                            "turns": turns}, {"schema_version": "1.10"},
                       persona_fields=([], set()))
    m = evaluate(tmp_path / "mixed", embedder="lookup", write=False, progress=False)
    assert m.human is not None and m.human.n_human_run == 6 and m.human.reference is None
    s = next(s for s in m.human.stats if s.metric == "politeness_client" and s.condition == "all")
    assert (s.n_simulated, s.n_human) == (4, 6)
    assert s.simulated_mean == pytest.approx(0.0)  # the model's line has no courtesy marker
    assert s.human_spread is not None and s.human_spread > 0
    assert m.human.calibration is None  # nobody was asked


def _played(tmp_path: Path, judged: list[bool | None], person: list[bool | None],
            ratings: list[int | None], out: Path | None = None) -> Path:
    """A run as play sessions leave it: scenarios (the goal judge's goal_met) and people's
    verdicts (person_goal_met, person_rating), written through the store."""
    out = out or tmp_path / "played"
    store = RunStore(out)
    store.create()
    store.set_persona_fields([], set())
    store.declare_scenarios()
    store.declare_humans()
    d_model, t_model = human_row_model(ScenarioDialogueRow), human_row_model(TurnRow)
    rows = [d_model.model_validate({**_dialogue(f"d{k}", "human", operator="op-000001",
                                                interface="terminal"), "scenario_id": "refund",
                                    "goal_met": j, "person_goal_met": p, "person_rating": r})
            for k, (j, p, r) in enumerate(zip(judged, person, ratings, strict=True))]
    turns = [t_model.model_validate(t) for k in range(len(rows))
             for t in _turns(f"d{k}", "I was charged twice.")]
    persona = {"persona_id": "p0", "persona_index": 0, "card": "A person."}
    store.write_batch("000001", {"personas": [persona], "dialogues": rows, "turns": turns})
    store.compact_all()
    store.write_json("manifest.json", {"schema_version": "1.10"})
    return out


def test_the_goal_judge_is_calibrated_against_the_persons_own_verdict(tmp_path: Path) -> None:
    judged = [True, True, True, True, False, False, None]
    person = [True, True, False, False, False, False, True]
    ratings = [5, 4, 3, 3, 1, 2, None]
    run = _played(tmp_path, judged, person, ratings)
    m = evaluate(run, embedder="lookup", progress=False)
    assert m.human is not None
    c = m.human.calibration
    assert c is not None and c.n == 6  # the undecided dialogue is left out
    assert c.judge_rate == pytest.approx(4 / 6) and c.person_rate == pytest.approx(2 / 6)
    assert c.bias == pytest.approx(2 / 6) and c.agreement == pytest.approx(4 / 6)
    # po = 4/6, pe = 4/6 * 2/6 + 2/6 * 4/6 = 16/36: kappa = (24 - 16) / (36 - 16) = 0.4
    assert c.kappa == pytest.approx(0.4)
    from scipy.stats import spearmanr  # the reference; scipy loads only for this test

    rho = spearmanr(ratings[:6], [1, 1, 1, 1, 0, 0]).statistic
    assert c.n_rated == 6 and c.spearman == pytest.approx(rho)
    report = (run / "eval" / "report.html").read_text()
    assert "Goal judge vs the person" in report


@pytest.mark.e2e
def test_the_cli_prints_the_goal_judges_calibration(tmp_path: Path) -> None:
    run = _played(tmp_path, [True, True, True, True, False, False, None],
                  [True, True, False, False, False, False, True], [5, 4, 3, 3, 1, 2, None])
    proc = subprocess.run([sys.executable, "-m", "spasm", "eval", str(run), "--embedder", "static",
                           "--no-progress"], capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Goal judge vs person (n=6): kappa 0.40, bias +0.33" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "spasm", "compare", str(run)], capture_output=True,
                          text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Goal judge vs person (n=6): kappa 0.40, bias +0.33" in proc.stdout


def test_a_fork_compares_the_simulators_next_turn_with_the_persons_on_the_same_prefix(
        tmp_path: Path) -> None:
    prefix = ["I want to return a kettle.", "Sure, what is the order number?"]
    sim_turn, person_turn = "The order number is 4411, thank you.", "ugh its 4411, I already told you"
    persona = {"persona_id": "p0", "persona_index": 0, "card": "A person."}
    original = {**_dialogue("d0", "llm"), "n_utterances": 4}
    original.pop("client_kind"), original.pop("responder_kind")  # a run of models, before 1.10
    texts = [*prefix, sim_turn, "Thanks, the return is booked."]
    turns = [{"dialogue_id": "d0", "turn_index": i, "speaker": ("client", "responder")[i % 2],
              "text": t} for i, t in enumerate(texts)]
    write_finished_run(tmp_path / "sim", {"personas": [persona], "dialogues": [original],
                                          "turns": turns}, {"schema_version": "1.10"},
                       persona_fields=([], set()))
    fork_texts = [*prefix, person_turn, "Sorry! The return is booked."]
    forks = [_dialogue("d0", "human", operator="op-00000a", interface="web", forked_from="d0",
                       forked_at=2),  # the same id as its original, in another run
             _dialogue("d1", "human", operator="op-00000a", interface="web", forked_from="gone",
                       forked_at=2)]
    fork_turns = [{"dialogue_id": did, "turn_index": i, "speaker": ("client", "responder")[i % 2],
                   "text": t} for did in ("d0", "d1") for i, t in enumerate(fork_texts)]
    write_finished_run(tmp_path / "fork", {"personas": [persona], "dialogues": forks,
                                           "turns": fork_turns}, {"schema_version": "1.10"},
                       persona_fields=([], set()))
    x, y = np.zeros(64), np.zeros(64)
    x[0], y[0], y[1] = 1.0, 0.6, 0.8  # cosine 0.6
    m = evaluate(tmp_path / "sim", embedder="lookup", reference=tmp_path / "fork", progress=False,
                 embedder_options={"table": {sim_turn: x.tolist(), person_turn: y.tolist()}})
    assert m.human is not None and m.human.forks is not None
    f = m.human.forks
    assert (f.n_forks, f.n_compared, f.skipped) == (2, 1, {"original_not_found": 1})
    assert f.cosine == pytest.approx(0.6, abs=1e-6)
    assert (f.words_simulated, f.words_human) == (7.0, 7.0)
    assert (f.politeness_simulated, f.politeness_human) == (1.0, 0.0)
    assert (f.frustration_simulated, f.frustration_human) == (0.0, 1.0)
    assert f.examples[0].simulated == sim_turn and f.examples[0].human == person_turn
    assert any("forked from" in n for n in m.human.notes)
    report = (tmp_path / "sim" / "eval" / "report.html").read_text()
    assert "on the same prefix" in report and "I already told you" in report


def test_a_folder_of_play_sessions_is_one_pooled_reference(tmp_path: Path) -> None:
    """Each play session is its own run (RUN.play/<session>/run, or several --out folders):
    a folder of them is a reference, their verdicts pooled for the calibration."""
    sessions = tmp_path / "RUN.play"
    _played(tmp_path, [True, True, True], [True, True, False], [5, 4, 3],
            out=sessions / "s-aaaa" / "run")
    _played(tmp_path, [True, False, False], [False, False, False], [3, 1, 2],
            out=sessions / "s-bbbb" / "run")
    sim = tmp_path / "sim"
    import_spasm_jsonl(SAMPLE, sim)
    m = evaluate(sim, embedder="lookup", reference=sessions, write=False, progress=False)
    assert m.realism is not None and m.realism.reference is not None
    assert m.realism.reference.dialogues == 6 and m.realism.reference.run_dir == str(sessions)
    assert m.human is not None and m.human.n_human_reference == 6
    c = m.human.calibration
    assert c is not None and c.n == 6 and c.kappa == pytest.approx(0.4)
    assert c.bias == pytest.approx(2 / 6)
    assert any("2 runs" in n for n in m.human.notes)
    assert any("6 of the 6 from the reference" in n for n in m.human.notes)


def test_people_in_group_seats_are_told_apart_by_their_seats_kind(tmp_path: Path) -> None:
    """A group dialogue's people are in its participants table (``kind``), not in the
    two-party ``client_kind`` column: a side whose seats are all people's is human, one with
    none a model's, and a side that mixes both is in neither set (and a note says so)."""
    seats_of = {"people": ("human", "human"), "models": ("llm", "llm"), "mixed": ("human", "llm")}
    plan = [("people", k) for k in range(6)] + [("models", k) for k in range(6, 10)] + [("mixed", 10)]
    dialogues, turns, seats = [], [], []
    for kind, k in plan:
        did = f"g{k}"
        dialogues.append({"dialogue_id": did, "persona_id": "p-ana", "conversation_index": k,
                          "condition": "ecp", "pairing": "m/m", "client_backend": "b", "client_model": "m",
                          "responder_backend": "b", "responder_model": "m", "seed": k,
                          "n_utterances": 3, "termination_reason": "max_utterances"})
        ana, ben = (PEOPLE_LINES[k] if kind == "people" else
                    ["Hello! I hope you are well.", "I would like some help with my order."])
        turns += [{"dialogue_id": did, "turn_index": t, "speaker": s, "text": x,
                   "role": "responder" if s == "Facilitator" else "client"}
                  for t, (s, x) in enumerate([("Ana", ana), ("Facilitator", "Tell us more."), ("Ben", ben)])]
        for i, (pid, seat_kind) in enumerate(zip(("Ana", "Ben", "Facilitator"), (*seats_of[kind], "llm"),
                                                 strict=True)):
            seats.append({"dialogue_id": did, "participant_id": pid, "position": i,
                          "role": "responder" if pid == "Facilitator" else "client",
                          "persona_id": None if pid == "Facilitator" else f"p-{pid.lower()}",
                          "backend": "human" if seat_kind == "human" else "b", "model": "m",
                          "kind": seat_kind, **({"operator": f"op-{k:06d}", "interface": "web"}
                                                if seat_kind == "human" else {})})
    personas = [{"persona_id": p, "persona_index": i, "card": f"{p} in a group."}
                for i, p in enumerate(("p-ana", "p-ben"))]
    write_finished_run(tmp_path / "group", {"personas": personas, "dialogues": dialogues, "turns": turns,
                                            "participants": seats}, {"schema_version": "1.10"},
                       persona_fields=([], set()))
    m = evaluate(tmp_path / "group", embedder="lookup", write=False, progress=False)
    assert m.human is not None and m.human.n_human_run == 7  # six of people, and the mixed one
    by = {(s.metric, s.condition): s for s in m.human.stats}
    s = by[("politeness_client", "all")]
    assert (s.n_simulated, s.n_human) == (4, 6)  # the mixed side is in neither
    assert s.simulated_mean == pytest.approx(0.0) and s.human_mean is not None and s.human_mean > 0
    assert ("mattr_responder", "all") not in by  # every facilitator is a model
    assert any("1 group dialogue(s) have people and models in seats of one role" in n for n in m.human.notes)
