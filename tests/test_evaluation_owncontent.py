"""Own content: drift, separability and consistency on what the Client wrote itself,
with the spans it copied removed. Known answers: a Client that copies its partner verbatim from
some turn on drifts differently on the raw text and exactly like its twin that does not copy on
own content; a dialogue without copying has own-content values equal to the raw ones."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from spasm.config import BackendConfig
from spasm.dataset.store import write_finished_run
from spasm.dataset.synthetic import write_run
from spasm.errors import UserError
from spasm.evaluation import evaluate, import_spasm_jsonl, register_embedder
from spasm.evaluation.compare import load_comparison
from spasm.evaluation.echoing import copied_words, without_copied
from spasm.evaluation.loader import Conversation
from spasm.evaluation.owncontent import OwnRule, own_content
from spasm.evaluation.pipeline import load_metrics
from spasm.evaluation.testing import LookupEmbedder
from spasm.personas.schema import load_schema
from spasm.testing import TestServer
from spasm.testing.server import default_reply
from tests.eval_cli import eval_cli

register_embedder("lookup", LookupEmbedder)

DIMS = ("utterance", "concerns", "emotion", "motivation")


def _conv(texts: list[str], speakers: list[str] | None = None) -> Conversation:
    speakers = speakers or ["client" if i % 2 == 0 else "responder" for i in range(len(texts))]
    return Conversation("d", "p", 0, "ecp", "a/b", "", tuple(speakers), tuple(texts))


# --------------------------------------------------------------------------- the rule


def test_words_in_a_four_word_run_said_before_are_copied() -> None:
    texts = [
        "My landlord never fixed the broken heating in winter.",
        "Have you asked him in writing about the broken heating?",
        "Yes. Have you asked him in writing, you say? I did, twice, and never heard back.",
    ]
    masks = copied_words(texts)
    assert masks[0] == [False] * 9  # the opening has nothing before it
    # "the broken heating" is three words: below n = 4, so the Responder copied nothing.
    assert not any(masks[1])
    # "have you asked him in writing" (six words) is the Responder's: copied; the rest is own.
    assert masks[2] == [False] + [True] * 6 + [False] * 9
    assert without_copied(texts[2], masks[2]) == "Yes. you say? I did, twice, and never heard back."
    # With n = 7 the six-word run is no longer long enough.
    assert not any(copied_words(texts, n=7)[2])


def test_a_run_of_stopwords_only_is_never_copied() -> None:
    texts = ["i am not sure what to tell him", "what to tell him is up to you", "is it what to tell him"]
    masks = copied_words(texts)
    # "what to tell him": "tell" is no stopword, so the run counts, from either earlier utterance.
    assert masks[1] == [True] * 4 + [False] * 4 and masks[2] == [False] * 2 + [True] * 4
    # "what to do here" and "it is in the" are stopwords only: never copied.
    assert not any(copied_words(["what to do here", "so what to do here"])[1])
    assert copied_words(["it is in the", "so it is in the end"], n=4)[1] == [False] * 6


def test_a_copied_tail_goes_with_its_punctuation_and_unchanged_text_stays_as_is() -> None:
    text = "I want my deposit back. Have you tried talking to your landlord directly?"
    mask = copied_words(["Have you tried talking to your landlord directly?", text])[1]
    assert without_copied(text, mask) == "I want my deposit back."
    assert without_copied("Nothing copied here, really.", [False] * 4) == "Nothing copied here, really."
    # A copied head keeps the utterance's own tail.
    head = copied_words(["my rent went up again this year", "My rent went up again this year! It hurts."])[1]
    assert without_copied("My rent went up again this year! It hurts.", head) == "It hurts."


def test_copying_from_itself_counts_and_short_leftovers_are_left_out() -> None:
    conv = _conv([
        "My boiler broke down last Tuesday night.",
        "That sounds cold; when did you call the plumber?",
        "My boiler broke down last Tuesday night. Still cold.",  # repeats its own opening
        "Did the plumber come?",
        "My boiler broke down last Tuesday night and the plumber never came back to fix it.",
    ])
    own = own_content([conv], OwnRule(ngram=4, min_words=4)).utterances["d"]
    assert [u.turn for u in own] == [0, 1, 2] and [u.index for u in own] == [0, 2, 4]
    assert own[0].text == conv.texts[0] and own[0].copied_share == 0.0
    # "Still cold." keeps 2 words < 4: left out; the third keeps 9 of 16 words.
    assert own[1].text is None and own[1].n_copied == 7 and not own[1].kept
    assert own[2].text == "and the plumber never came back to fix it."
    assert own[2].copied_share == pytest.approx(7 / 16)
    # A lower minimum keeps "Still cold.".
    assert own_content([conv], OwnRule(min_words=2)).utterances["d"][1].text == "Still cold."


def test_the_rule_rejects_meaningless_thresholds() -> None:
    with pytest.raises(ValueError):
        OwnRule(ngram=1)
    with pytest.raises(ValueError):
        OwnRule(min_words=0)


# --------------------------------------------------------------------------- known answers


N_PERSONAS = 12
RECOGNISED = 2  # personas whose own lines lie near their card: retrieved first on their own
N_CLIENT_TURNS = 5
COPY_FROM = 2  # CONCAT's Client copies the Responder verbatim from its third turn on


def _word(*parts: int) -> str:
    # Letters only, one token each for the rule's tokenizer: "qa", "qb", ... never repeat.
    return "".join(chr(ord("a") + (p % 26)) + chr(ord("a") + (p // 26) % 26) for p in parts)


def _client(i: int, t: int) -> str:
    return " ".join(f"c{_word(i, t, k)}" for k in range(6)) + "."


def _responder(i: int, t: int, cond: str) -> str:
    return "Have you " + " ".join(f"r{_word(i, t, k)}{cond[0]}" for k in range(6)) + "?"


def _known_run(tmp_path: Path) -> tuple[Path, dict[str, list[float]]]:
    """Twelve personas, ECP and CONCAT on the same seeds. The ECP Client writes its own lines;
    the CONCAT Client writes the same own lines and, from client turn 2 on, appends the
    Responder's previous turn verbatim. The opening and the own lines of persona i lie near one
    direction (small utterance drift), which is its card's for the first two personas only;
    the utterances with a copied Responder turn lie near the persona's card (the Responder
    quotes the persona's situation back), far from its own lines (drift near 1)."""
    rng = np.random.default_rng(7)
    table: dict[str, list[float]] = {}
    personas = []
    dialogues = []
    for i in range(N_PERSONAS):
        card = rng.standard_normal(64)
        table[f"Persona {i} card."] = card.tolist()
        base = card if i < RECOGNISED else rng.standard_normal(64)
        for t in range(N_CLIENT_TURNS):
            table[_client(i, t)] = (base + 0.5 * rng.standard_normal(64)).tolist()
        personas.append({"persona_id": f"p{i}", "card": f"Persona {i} card.", "concern": f"concern {i}",
                         "emotion": "worried", "intensity": "high", "motivation": f"motivation {i}"})
        for cond in ("ecp", "concat"):
            texts: list[str] = []
            for t in range(N_CLIENT_TURNS):
                line = _client(i, t)
                if cond == "concat" and t >= COPY_FROM:
                    line = f"{line} {texts[-1]}"  # the partner's previous turn, verbatim
                    table[line] = (card + 0.3 * rng.standard_normal(64)).tolist()
                texts += [line, _responder(i, t, cond)]
            dialogues.append({"dialogue_id": f"p{i}-{cond}", "persona_id": f"p{i}", "condition": cond,
                              "seed": i, "texts": texts})
    return write_run(tmp_path / "run", personas, dialogues), table


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run, table = _known_run(tmp_path_factory.mktemp("own"))
    evaluate(run, embedder="lookup", embedder_options={"table": table}, progress=False)
    return run


def test_raw_drift_differs_and_own_content_drift_does_not(known: Path) -> None:
    comparison = load_comparison(known / "eval" / "compare.json")
    by = {c.metric: c for c in comparison.contrasts if c.pairing == "all"}
    raw, own = by["drift_utterance"], by["drift_utterance_own"]
    # Copying the partner makes CONCAT drift away from its opening: ECP − CONCAT < 0, significant.
    assert raw.n_pairs == N_PERSONAS and raw.delta is not None and raw.delta < -0.2 and raw.significant
    # On own content the two Clients wrote the same words: every paired difference is 0.
    assert own.n_pairs == N_PERSONAS and own.delta == 0.0 and not own.significant
    assert raw.explained_by_copying and not own.explained_by_copying
    for dim in DIMS:
        assert by[f"drift_{dim}_own"].delta == 0.0
    assert comparison.copying is not None
    assert comparison.copying.startswith("Once copying is removed (own content), these differences vanish: ")
    assert "drift_utterance (ecp − concat)" in comparison.copying


def test_copying_makes_personas_look_identifiable_and_own_content_does_not(known: Path) -> None:
    per = pd.read_parquet(known / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    hit = {(i, cond): per.loc[f"p{i}-{cond}", "persona_hit_at_1"] for i in range(N_PERSONAS)
           for cond in ("ecp", "concat")}
    # Raw: every copying CONCAT Client is retrieved first (it carries its card's words); ECP's
    # only where its own lines lie near the card.
    assert all(hit[(i, "concat")] == 1.0 for i in range(N_PERSONAS))
    assert [hit[(i, "ecp")] for i in range(RECOGNISED)] == [1.0] * RECOGNISED
    own = {(i, cond): per.loc[f"p{i}-{cond}", "persona_hit_at_1_own"] for i in range(N_PERSONAS)
           for cond in ("ecp", "concat")}
    assert all(own[(i, "concat")] == own[(i, "ecp")] == hit[(i, "ecp")] for i in range(N_PERSONAS))
    metrics = load_metrics(known)
    acc = {g.condition: g.acc_at_k[0] for g in metrics.separability}
    acc_own = {g.condition: g.acc_at_k[0] for g in metrics.separability_own}
    # The per-dialogue hits average to the group's Acc@1 (stored to 6 decimals).
    ecp_hits = per[per.condition == "ecp"].persona_hit_at_1.mean()
    assert acc["concat"] == 1.0 and acc["ecp"] == pytest.approx(ecp_hits, abs=1e-6)
    assert acc_own["concat"] == acc_own["ecp"] == acc["ecp"]
    comparison = load_comparison(known / "eval" / "compare.json")
    by = {c.metric: c for c in comparison.contrasts if c.pairing == "all"}
    raw, mine = by["persona_hit_at_1"], by["persona_hit_at_1_own"]
    assert raw.significant and raw.delta is not None and raw.delta < -0.5 and raw.explained_by_copying
    assert mine.delta == 0.0 and not mine.significant
    assert "persona_hit_at_1 (ecp − concat)" in (comparison.copying or "")
    groups = {g.condition: g for g in comparison.groups}
    assert groups["concat"].acc_at_1 == 1.0 and groups["concat"].acc_at_1_own == acc["ecp"]


def test_without_copying_own_content_values_equal_the_raw_ones(known: Path) -> None:
    per = pd.read_parquet(known / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    ecp = per[per.condition == "ecp"]
    for dim in DIMS:
        assert (ecp[f"drift_{dim}_own"] == ecp[f"drift_{dim}"]).all(), dim
        # CONCAT on own content equals its ECP twin: the same own words at the same turns.
        for i in range(N_PERSONAS):
            assert per.loc[f"p{i}-concat", f"drift_{dim}_own"] == per.loc[f"p{i}-ecp", f"drift_{dim}"]
    metrics = load_metrics(known)
    raw_sep = {g.condition: g for g in metrics.separability}
    own_sep = {g.condition: g for g in metrics.separability_own}
    assert own_sep["ecp"].model_dump() == raw_sep["ecp"].model_dump()
    # CONCAT's conversations on own content are ECP's, so they separate exactly as well.
    for field in ("silhouette", "davies_bouldin", "intra_mean", "acc_at_k"):
        assert getattr(own_sep["concat"], field) == getattr(raw_sep["ecp"], field), field
    own = metrics.drift.own
    assert own is not None and own.dimensions == list(DIMS)
    curves = {(p.dimension, p.condition, p.turn): p.mean for p in own.curves}
    raw_curves = {(p.dimension, p.condition, p.turn): p.mean for p in metrics.drift.curves}
    assert all(curves[("utterance", "ecp", t)] == raw_curves[("utterance", "ecp", t)]
               for t in range(N_CLIENT_TURNS))
    # The copied turns are left out of CONCAT's own content (nothing of its own is missing:
    # the own part keeps six words), so its curve is ECP's turn by turn.
    assert all(curves[("utterance", "concat", t)] == curves[("utterance", "ecp", t)]
               for t in range(N_CLIENT_TURNS))


def test_the_copied_share_of_every_client_utterance_is_in_per_turn(known: Path) -> None:
    turns = pd.read_parquet(known / "eval" / "per_turn.parquet")
    assert len(turns) == 2 * N_PERSONAS * N_CLIENT_TURNS
    assert set(turns.speaker) == {"client"} and (turns.turn_index == 2 * turns.client_turn).all()
    ecp, concat = turns[turns.condition == "ecp"], turns[turns.condition == "concat"]
    assert (ecp.copied_share == 0).all() and ecp.kept.all() and (ecp.n_copied_words == 0).all()
    early = concat[concat.client_turn < COPY_FROM]
    late = concat[concat.client_turn >= COPY_FROM]
    assert (early.copied_share == 0).all()
    # Six own words and the Responder's eight copied: 8 / 14, and the own line is what is left.
    assert (late.n_copied_words == 8).all() and np.allclose(late.copied_share, 8 / 14)
    assert list(late.own_text) == [_client(int(did[1:].split("-")[0]), t)
                                   for did, t in zip(late.dialogue_id, late.client_turn, strict=True)]
    # Per turn, the drift beside it: raw differs on the copied turns, own content does not.
    persona = {"persona": lambda f: f.dialogue_id.str.split("-").str[0]}
    both = ecp.assign(**persona).merge(concat.assign(**persona), on=["persona", "client_turn"],
                                       suffixes=("_e", "_c"))
    assert len(both) == N_PERSONAS * N_CLIENT_TURNS
    assert (both.drift_utterance_own_e == both.drift_utterance_own_c).all()
    # The copied turns lie near the card, far from the own lines but for the two personas whose
    # own lines lie near their card too.
    far = both[(both.client_turn >= COPY_FROM) & (both.persona.str[1:].astype(int) >= RECOGNISED)]
    assert len(far) and (far.drift_utterance_c > far.drift_utterance_e + 0.3).all()
    metrics = load_metrics(known)
    assert metrics.own_content is not None and metrics.own_content.ngram == 4
    stats = {s.condition: s for s in metrics.own_content.stats}
    assert stats["ecp"].with_copying == 0 and stats["ecp"].copied_share == 0.0
    assert stats["concat"].with_copying == N_PERSONAS * (N_CLIENT_TURNS - COPY_FROM)
    assert stats["concat"].left_out == 0 and stats["all"].utterances == 2 * N_PERSONAS * N_CLIENT_TURNS


def test_a_client_left_with_too_little_of_its_own_is_left_out(tmp_path: Path) -> None:
    # The Client only parrots from turn 1 on: those utterances are left out, turn 0 stays.
    personas = [{"persona_id": f"p{i}", "card": f"card {i}", "concern": f"concern {i}"} for i in range(3)]
    dialogues = []
    for i in range(3):
        reply = f"Could you tell me more about problem number {i} please?"
        dialogues.append({"dialogue_id": f"d{i}", "persona_id": f"p{i}", "seed": i,
                          "texts": [f"My problem {i} is a leaking roof.", reply, reply, reply, reply]})
    run = write_run(tmp_path / "run", personas, dialogues)
    evaluate(run, embedder="lookup", progress=False)
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert per.drift_utterance.notna().all() and per.drift_utterance_own.isna().all()
    turns = pd.read_parquet(run / "eval" / "per_turn.parquet")
    assert list(turns.kept) == [True, False, False] * 3
    assert turns.own_text.isna().sum() == 6 and (turns[~turns.kept].copied_share == 1.0).all()
    metrics = load_metrics(run)
    assert metrics.own_content is not None
    assert {s.condition: s.left_out for s in metrics.own_content.stats} == {"all": 6, "ecp": 6}
    assert metrics.drift.own is not None
    assert not any(math.isfinite(p.mean or math.nan) for p in metrics.drift.own.curves if p.turn >= 1)


# --------------------------------------------------------------------------- consistency


def _consistency_reply(body: dict[str, Any]) -> str:
    """A judge that finds every CLIENT line holding a helper's question ("Have you ...")
    inconsistent with the card, and every other line consistent."""
    system = str(body["messages"][0]["content"])
    user = str(body["messages"][-1]["content"])
    if "CLIENT" in system and "labels" in system:
        lines = re.findall(r"^\[\d+\] CLIENT: (.*)$", user, flags=re.M)
        if "against itself" in system:
            lines = lines[1:]
        return json.dumps({"labels": [0 if "Have you" in line else 1 for line in lines]})
    return default_reply(body)


@pytest.mark.e2e
def test_prompt_to_line_on_own_content_judges_only_what_changed(tmp_path: Path) -> None:
    run, table = _known_run(tmp_path)
    with TestServer(reply=_consistency_reply, models=("judge-model",)) as srv:
        config = BackendConfig(kind="openai", base_url=srv.base_url, model="judge-model", api_key_env=None)
        m = evaluate(run, embedder="lookup", embedder_options={"table": table}, progress=False,
                     consistency=True, own_consistency=True, llm_config=config)
        p2l = [r for r in srv.requests if str(r["messages"][-1]["content"]).startswith("Persona card:")
               and "CLIENT lines:" in str(r["messages"][-1]["content"])]
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    ecp, concat = per[per.condition == "ecp"], per[per.condition == "concat"]
    # ECP's lines are its own: prompt-to-line 1 both ways, its raw labels reused.
    assert (ecp.consistency_prompt_to_line == 1.0).all() and (ecp.consistency_prompt_to_line_own == 1.0).all()
    # CONCAT's copied turns carry the Responder's question: 3 of 5 lines inconsistent raw,
    # none once the copied spans are removed.
    assert (concat.consistency_prompt_to_line == 2 / 5).all()
    assert (concat.consistency_prompt_to_line_own == 1.0).all()
    # One prompt-to-line call per dialogue, and one more per CONCAT dialogue (its own content),
    # none for ECP's unchanged lines. CONCAT's own lines and card are its ECP twin's, so that
    # request is the same one and the cache answers it: sent once per persona.
    calls = pd.read_parquet(run / "calls.parquet")
    cons = calls[calls.role == "eval_consistency"]
    assert len(cons) == 2 * (2 * N_PERSONAS) + N_PERSONAS
    assert len(p2l) == 2 * N_PERSONAS
    assert m.consistency is not None
    own = {s.condition: s.mean for s in m.consistency.stats if s.measure == "prompt_to_line_own"}
    assert own == {"all": 1.0, "ecp": 1.0, "concat": 1.0}
    comparison = load_comparison(run / "eval" / "compare.json")
    raw = next(c for c in comparison.contrasts if c.metric == "consistency_prompt_to_line")
    assert raw.explained_by_copying and raw.delta == pytest.approx(0.6)


# --------------------------------------------------------------------------- group dialogues


FAC, ANA, BEN = "Facilitator", "Ana", "Ben"


def _group_run(run: Path) -> Path:
    """Two group dialogues with the same seats: in g-copy Ana repeats the facilitator's
    previous turn after her own words from her second turn on; in g-clean nobody copies."""
    schema = load_schema(None)
    personas = [{"persona_id": "p-ana", "persona_index": 0, "card": "Ana rents a flat.", "concern": "rent"},
                {"persona_id": "p-ben", "persona_index": 1, "card": "Ben works nights.", "concern": "sleep"}]
    dialogues: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    seats: list[dict[str, Any]] = []
    for did in ("g-copy", "g-clean"):
        said: list[tuple[str, str]] = []
        for k in range(3):
            said.append((FAC, "Tell us " + " ".join(f"f{_word(k, j)}{did[2]}" for j in range(6)) + "."))
            ana = " ".join(f"a{_word(k, j)}" for j in range(6)) + "."
            if did == "g-copy" and k >= 1:
                ana = f"{ana} {said[-1][1]}"
            said += [(ANA, ana), (BEN, " ".join(f"b{_word(k, j)}{did[2]}" for j in range(6)) + ".")]
        dialogues.append({"dialogue_id": did, "persona_id": "p-ana", "n_utterances": len(said),
                          "conversation_index": 0, "condition": "ecp", "pairing": "srv/srv", "seed": 1,
                          "client_backend": "srv", "client_model": "m", "responder_backend": "srv",
                          "responder_model": "m", "termination_reason": "max_utterances"})
        turns += [{"dialogue_id": did, "turn_index": t, "speaker": who, "text": text,
                   "role": "responder" if who == FAC else "client"} for t, (who, text) in enumerate(said)]
        seats += [{"dialogue_id": did, "participant_id": pid, "position": i,
                   "role": "responder" if pid == FAC else "client",
                   "persona_id": {ANA: "p-ana", BEN: "p-ben"}.get(pid), "backend": "srv", "model": "m"}
                  for i, pid in enumerate([FAC, ANA, BEN])]
    write_finished_run(run, {"personas": personas, "dialogues": dialogues, "turns": turns,
                             "participants": seats}, {"kind": "synthetic", "schema_version": "1.7"},
                       persona_fields=(schema.field_names, schema.integer_fields()))
    return run


def test_each_client_seat_of_a_group_is_measured_on_its_own_content(tmp_path: Path) -> None:
    run = _group_run(tmp_path / "run")
    evaluate(run, embedder="lookup", progress=False)
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    for dim in DIMS:  # no copying: own content equals raw (emotion, motivation: no persona field)
        raw, own = per.loc["g-clean", f"group_drift_{dim}"], per.loc["g-clean", f"group_drift_{dim}_own"]
        assert raw == own or (dim in ("emotion", "motivation") and math.isnan(raw) and math.isnan(own))
    assert math.isfinite(per.loc["g-clean", "group_drift_utterance"])
    # Ana's own lines are the same words in both dialogues, Ben's differ only in their last
    # letter: raw seat drift moves with the copied text, Ana's own-content drift does not.
    assert per.loc["g-copy", "group_drift_utterance"] != per.loc["g-copy", "group_drift_utterance_own"]
    turns = pd.read_parquet(run / "eval" / "per_turn.parquet")
    assert set(turns.speaker) == {ANA, BEN} and len(turns) == 2 * 6
    copied = turns[(turns.dialogue_id == "g-copy") & (turns.speaker == ANA)]
    assert list(copied.copied_share) == [0.0, 8 / 14, 8 / 14]
    assert list(copied.own_text) == [" ".join(f"a{_word(k, j)}" for j in range(6)) + "." for k in range(3)]
    assert (turns[turns.speaker == BEN].copied_share == 0).all()
    assert turns.drift_utterance.isna().all()  # a group's drift is per seat, in per_dialogue
    seats = pd.read_parquet(run / "eval" / "per_participant.parquet")
    seats = seats.set_index(["dialogue_id", "participant_id"])
    # Per seat: Ben copied nothing, so his own-content drift is his raw drift; Ana's differs.
    for did in ("g-copy", "g-clean"):
        assert seats.loc[(did, BEN), "drift_utterance_own"] == seats.loc[(did, BEN), "drift_utterance"]
    assert seats.loc[("g-copy", ANA), "drift_utterance_own"] != seats.loc[("g-copy", ANA), "drift_utterance"]
    assert math.isnan(seats.loc[("g-copy", FAC), "drift_utterance_own"])


# --------------------------------------------------------------------------- imported runs, the CLI


def test_an_imported_release_is_measured_on_own_content(tmp_path: Path) -> None:
    record = {
        "persona_id": "P-9", "conversation_id": "C-1",
        "persona_fields": {"concerns": ["my pension"], "emotion": "anxious", "motivation": "retire"},
        "persona_description": "You are worried about your pension.",
        "turns": [
            {"speaker": "client", "turn_index": 0, "text": "I'm worried my pension won't be enough."},
            {"speaker": "tested", "turn_index": 1, "text": "Let's look at your employer match and fees."},
            {"speaker": "client", "turn_index": 2,
             "text": "Yes, let's look at your employer match and fees."},
        ],
        "termination_reason": "natural",
    }
    src = tmp_path / "release.jsonl"
    src.write_text(json.dumps(record) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    import_spasm_jsonl(src, run)
    evaluate(run, embedder="lookup", progress=False)
    turns = pd.read_parquet(run / "eval" / "per_turn.parquet")
    # "let's look at your employer match and fees" is the Responder's: 8 of 9 words copied.
    assert list(turns.copied_share) == [0.0, 8 / 9] and list(turns.kept) == [True, False]
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert math.isfinite(per.drift_utterance[0]) and math.isnan(per.drift_utterance_own[0])


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--own-ngram", "1"], "--own-ngram must be at least 2"),
     (["--own-min-words", "0"], "--own-min-words at least 1"),
     (["--own-consistency"], "add --consistency")],
)
def test_the_own_content_flags_are_checked(tmp_path: Path, flags: list[str], message: str) -> None:
    run, _ = _known_run(tmp_path)
    with pytest.raises(UserError, match=message):
        eval_cli(["eval", str(run), "--embedder", "lookup", "--no-progress", *flags])


@pytest.mark.e2e
def test_the_thresholds_reach_the_rule_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = _known_run(tmp_path)
    # With n = 9 the Responder's eight-word turn is too short to count as a copied run.
    assert eval_cli(["eval", str(run), "--embedder", "lookup", "--no-progress", "--own-ngram", "9"]) == 0
    assert "Own content: 0.0% of the Client's words copied (runs of 9+ words" in capsys.readouterr().out
    metrics = load_metrics(run)
    assert metrics.own_content is not None and metrics.own_content.ngram == 9
    assert all(s.with_copying == 0 for s in metrics.own_content.stats)
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet")
    assert (per.drift_utterance_own == per.drift_utterance).all()
