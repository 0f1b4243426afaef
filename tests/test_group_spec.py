"""A group dialogue's spec has seats, not a pairing: its plan carries no pairing and
no single persona, the config names the run's backends and its helper backend from the seats,
and the rows still name the first client and responder seats, as they always have."""

from __future__ import annotations

from typing import Any

import anyio
import pandas as pd

from spasm.config import parse_config
from spasm.engine import Engine
from spasm.evaluation.llm import resolve_backend
from spasm.runner import DialogueSpec, GroupSpec
from spasm.runplan import make_backends, plan
from spasm.testing import TestServer
from tests.conftest import endpoint_config, make_persona


def _group(base_url: str, **overrides: Any) -> dict[str, Any]:
    """Four seats on three backends (the first client seat on ``cli``, the responder on
    ``fac``, another client on ``other``), a moderator on a fourth."""
    model = {"kind": "openai", "base_url": base_url}
    data = endpoint_config(
        base_url, personas={"n": 6}, conditions=["ecp"],
        backends={"cli": {**model, "model": "m-cli"}, "other": {**model, "model": "m-other"},
                  "fac": {**model, "model": "m-fac"}, "mod": {**model, "model": "m-mod"},
                  "unused": {**model, "model": "m-unused"}},
        participants=[
            {"id": "Ana", "role": "client", "backend": "cli"},
            {"id": "Facilitator", "role": "responder", "backend": "fac"},
            {"id": "Ben", "role": "client", "backend": "other"},
            {"id": "Carla", "role": "client", "backend": "cli"},
        ],
        group={"max_utterances": 6, "moderator_backend": "mod"},
    )
    data.pop("pairings")
    for key, value in overrides.items():  # merged into the sections above
        data[key] = {**data.get(key, {}), **value}
    return data


def test_a_group_plan_has_seats_and_no_pairing_or_single_persona() -> None:
    config = parse_config(_group("http://127.0.0.1:9/v1"), "<test>")
    personas = [make_persona(f"p{i}", i) for i in range(6)]
    specs = list(plan(config, personas))
    assert len(specs) == 2 and all(isinstance(s, GroupSpec) for s in specs)
    for s in specs:
        assert isinstance(s, GroupSpec)
        assert not hasattr(s, "pairing") and not hasattr(s, "persona")
        assert [f.participant.id for f in s.seats] == ["Ana", "Facilitator", "Ben", "Carla"]
        # What the dialogues row names: the first client seat's persona and backend, the first
        # responder seat's backend.
        ana = s.seats[0].persona
        assert ana is not None and s.persona_id == ana.id
        assert (s.client_backend, s.responder_backend, s.pairing_label) == ("cli", "fac", "cli/fac")
        assert s.levels == ("A", "A", "A", "A")


def test_a_group_configs_backends_are_its_seats_and_helpers_not_a_pairing() -> None:
    config = parse_config(_group("http://127.0.0.1:9/v1", personas={"backend": "other"},
                                 termination={"judge": True, "judge_backend": "mod"}), "<test>")
    assert config.pairing_list == []  # a group run has seats, not two-party pairings
    assert config.dialogue_backends == ["cli", "fac", "other"]
    assert config.used_backends == ["cli", "fac", "mod", "other"]  # never the unused one
    assert config.helper_backend == "cli"  # the first client seat's
    assert config.seat_backend("responder") == "fac"
    assert sorted(make_backends(config)) == config.used_backends
    assert config.plan_factors() == ([2, 1, 1, 1, 1], "personas × conversations × pairings × "
                                     "conditions × harness levels")


def test_a_two_party_configs_backends_are_its_pairings_and_helpers() -> None:
    data = endpoint_config("http://127.0.0.1:9/v1")
    model = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}
    data["backends"] |= {"b": {**model, "model": "mb"}, "judge": {**model, "model": "mj"}}
    data["pairings"] = [{"client": "b", "responder": "srv"}, {"client": "srv", "responder": "b"}]
    data["termination"] |= {"judge": True, "judge_backend": "judge"}
    config = parse_config(data, "<test>")
    assert [p.label for p in config.pairing_list] == ["b/srv", "srv/b"]
    assert config.dialogue_backends == ["b", "srv"]
    assert config.used_backends == ["b", "judge", "srv"]
    assert config.helper_backend == "b"  # the first pairing's client
    spec = next(iter(plan(config, [make_persona()])))
    assert isinstance(spec, DialogueSpec)
    assert (spec.persona_id, spec.pairing_label, spec.client_backend) == ("p0", "b/srv", "b")


def test_a_group_run_names_its_first_client_and_responder_seats_in_its_rows(tmp_path: Any) -> None:
    run = tmp_path / "run"
    with TestServer() as srv:
        config = parse_config(_group(srv.base_url), "<test>")
        summary = anyio.run(Engine(config, run, progress=False, sleep_scale=0).run)
    assert summary.completed == summary.planned == 2, summary.line()
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    seats = pd.read_parquet(run / "participants.parquet")
    first = seats[seats.participant_id == "Ana"].set_index("dialogue_id").persona_id
    for _, row in dialogues.iterrows():
        assert (row.pairing, row.client_backend, row.client_model, row.responder_backend,
                row.responder_model) == ("cli/fac", "cli", "m-cli", "fac", "m-fac")
        assert row.persona_id == first[row.dialogue_id]
    # The eval probe and judge default to the run's helper backend, named honestly.
    chosen = resolve_backend(run)
    assert (chosen.name, chosen.source) == ("cli", "run config (first client seat's)")


def test_a_groups_in_flight_count_shard_sizing_and_ray_estimate_read_every_seat(
    tmp_path: Any,
) -> None:
    """The engine's dialogues in flight count every seat's backend (not the first two), a
    shard is sized by every backend the run uses (the moderator's too), and the Ray progress
    estimate counts group dialogues."""
    from spasm.executors.ray_executor import _planned_estimate
    from spasm.executors.shards import parallel_shards

    data = _group("http://127.0.0.1:9/v1")
    data["conditions"] = ["ecp", "concat"]
    for name, slots in {"cli": 2, "fac": 3, "other": 5, "mod": 1}.items():
        data["backends"][name]["max_concurrency"] = slots
    config = parse_config(data, "<test>")
    engine = Engine(config, tmp_path / "run", progress=False)
    assert engine.dialogues_in_flight(make_backends(config)) == 2 * (2 + 3 + 5)
    assert parallel_shards(config, 4, 4) == 1  # the moderator takes one request at a time
    assert _planned_estimate(config) == 2 * 2  # group dialogues × conditions
