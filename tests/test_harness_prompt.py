"""The orchestrated prompt: a snapshot for a fixed policy/state, and its cache-friendly prefix.

Regenerate the snapshots after an intended change with ``SPASM_UPDATE_SNAPSHOTS=1 pytest
tests/test_harness_prompt.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest

from spasm.agents import PlainAgent, TurnAgent, client_system_prompt
from spasm.backends.base import Backend, ChatRequest, Completion, Message
from spasm.backends.instances import instance_from_schema
from spasm.calls import Caller, CallScope
from spasm.config import BackendConfig, parse_config
from spasm.dataset.persona_rows import persona_of
from spasm.harness.runtime import HarnessedAgent
from spasm.history import History
from spasm.projection import Viewer, project
from spasm.runner import DialogueSpec, build_agents
from spasm.seeds import derive_seed
from spasm.session import DialogueSession, PrefixTracker

SNAPSHOTS = Path(__file__).parent / "snapshots"

PERSONA = persona_of({
    "persona_id": "p0000-test", "persona_index": 0, "first_name": "Mei", "age": 34, "occupation": "Nurse",
    "city": "Lyon, France", "domain": "broken washing machine warranty",
    "concern": "whether the warranty covers a second repair", "motivation": "wants a clear answer",
    "emotion": "frustrated", "intensity": "moderate", "verbosity": "terse",
    "directness": "direct", "cooperativeness": "neutral", "formality": "casual",
    "card": "You are Mei, a 34-year-old nurse living in Lyon, France. (card text)",
})
LINES = [
    ("client", "Hi, my washing machine broke again, third time this year!"),
    ("responder", "I'm sorry to hear that. Could you tell me the model number?"),
    ("client", "It's a WX-200. Does the warranty cover a second repair?"),
    ("responder", "Let me check. When did you buy it?"),
    ("client", "Last March, from your Lyon store."),
    ("responder", "Thanks. Has a technician visited before?"),
    ("client", "Yes, Pierre came in June and replaced the pump."),
    ("responder", "Understood. Was the same fault reported this time?"),
    ("client", "I think so, it leaks again. I'm really fed up."),
    ("responder", "I understand. Should I book a technician for you this week?"),
]


class ScriptedBackend(Backend):
    """An in-process backend: fixed JSON per schema title, a fixed sentence otherwise."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.name = "fake"
        self.model = "fake-model"
        self.max_concurrency = 4
        self.replies = replies
        self.requests: list[ChatRequest] = []

    async def complete(self, request: ChatRequest) -> Completion:
        self.requests.append(request)
        if request.json_schema is not None:
            title = request.json_schema.get("title", "")
            if title == "CharacterPolicy" and "(card text)" not in json.dumps(request.messages):
                title = "ResponderPolicy"
            body = self.replies.get(title, instance_from_schema(request.json_schema))
            text = json.dumps(body)
        else:
            text = f"Reply {len(self.requests)}: that does not sound right to me."
        return Completion(text=text, prompt_tokens=sum(len(m["content"].split())
                                                       for m in request.messages),
                          completion_tokens=len(text.split()), resolved_model="fake-model")


REPLIES: dict[str, Any] = {
    "CharacterPolicy": {
        "facts": ["You have owned the machine since last March."], "values": ["Fairness"],
        "decision_policies": ["You ask for things in writing."], "style_rules": ["No emojis."],
        "speech_patterns": ["You start with 'Look,' when annoyed."],
        "boundaries": {"never": ["Never accept a vague promise."], "always": []},
    },
    "ResponderPolicy": {
        "facts": ["You work for the after-sales team."], "values": [], "decision_policies": [],
        "style_rules": [], "speech_patterns": [],
        "boundaries": {"never": ["Never promise a date you cannot keep."], "always": []},
    },
    "StateUpdate": {
        "stimulus": True, "changes": [{"dimension": "emotion.anger", "value": 95,
                                       "evidence": "book a technician"}],
        "strategy": "Ask for the repair to be confirmed in writing.", "new_belief": "",
        "drift_detected": False,
    },
    "CheckerOutput": {
        "dimension_scores": {"boundary": 95, "fact": 90, "state": 85, "style": 80},
        "violations": [], "correction_advice": "",
    },
}


def _config(**harness: Any) -> Any:
    return parse_config({
        "backends": {"fake": {"kind": "embedded"}},
        "pairings": [{"client": "fake", "responder": "fake"}],
        "dialogue": {"max_turns_per_agent": 10},
        "harness": {"window": 4, "stride": 2, **harness},
    })


def _harness(level: str, speaker: str = "client", condition: str = "ecp") -> tuple[
    TurnAgent, DialogueSession, ScriptedBackend
]:
    """The agent ``build_agents`` makes for ``speaker`` at ``level``, and its session."""
    config = _config()
    spec = DialogueSpec(dialogue_id="d1", persona=PERSONA, conversation_index=0, condition=condition,
                        pairing=config.pairing_list[0], seed=7, levels=(level, level))
    client, responder = build_agents(spec, config)
    agent = client if speaker == "client" else responder
    backend = ScriptedBackend(REPLIES)
    caller = Caller({"fake": backend}, {"fake": BackendConfig(kind="embedded")})
    session = DialogueSession(caller, CallScope(dialogue_id="d1"), condition, 7, PrefixTracker(16))
    return agent, session, backend


def _history(n: int) -> History:
    h = History()
    for speaker, text in LINES[:n]:
        h = h.append(speaker, text)  # type: ignore[arg-type]
    return h


def _render(messages: list[Message]) -> str:
    return "\n".join(f"=== {m['role']} ===\n{m['content']}" for m in messages) + "\n"


def _check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("SPASM_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        if not path.exists() and os.environ.get("SPASM_UPDATE_SNAPSHOTS") != "1":
            pytest.fail(f"missing snapshot {path}; create it with SPASM_UPDATE_SNAPSHOTS=1")
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed; if intended, regenerate with SPASM_UPDATE_SNAPSHOTS=1 and review the diff"
    )


async def _turns(h: TurnAgent, session: DialogueSession, upto: int) -> list[list[Message]]:
    """The client's prompts at each of its turns up to utterance ``upto``."""
    await h.setup(session)
    seen = []
    for n in range(0, upto, 2):
        r = await h.turn(_history(n), session)
        seen.append(r.messages)
    return seen


@pytest.mark.parametrize("condition", ["ecp", "concat"])
def test_orchestrated_prompt_snapshot(condition: str) -> None:
    h, session, _ = _harness("E", condition=condition)
    prompts = anyio.run(_turns, h, session, 10)
    _check_snapshot(f"harness_prompt_E_{condition}.txt", _render(prompts[-1]))


def test_prompt_order_and_what_is_never_in_it() -> None:
    h, session, _ = _harness("E")
    last = anyio.run(_turns, h, session, 10)[-1]
    system, context, notes = last[0]["content"], last[1]["content"], last[-1]["content"]
    # Stable block in order: identity facts, then style rules, then never-boundaries.
    assert system.index("Who you are:") < system.index("How you write:") < system.index("Never:")
    # Turn block in order: state items, scene, examples, correction.
    assert notes.index("Where you stand now:") < notes.index("Scene:") < notes.index("Examples")
    assert context.startswith("Earlier in this conversation")
    # Never the whole state: no JSON, at most state_items items.
    block = notes.split("Where you stand now:\n")[1].split("\n\n")[0]
    assert len(block.splitlines()) <= 4 and "{" not in notes
    # The Client is never told it is an AI; its card is compiled into the policy (level C+).
    assert " AI" not in json.dumps(last) and "(card text)" not in system


def test_stable_prefix_is_identical_across_turns() -> None:
    for condition in ("ecp", "concat"):
        h, session, _ = _harness("E", condition=condition)
        prompts = anyio.run(_turns, h, session, 10)
        assert len({p[0]["content"] for p in prompts}) == 1
        assert prompts[0][0]["role"] == "system"
    # Under ECP, between two folds of the context the previous prompt (less its final turn
    # block) is a prefix of the next one, so a provider cache serves all of it.
    h, session, _ = _harness("E")
    prompts = anyio.run(_turns, h, session, 10)
    prefix_pairs = [
        (a, b) for a, b in pairwise(prompts)
        if a[1]["content"] == b[1]["content"]
    ]
    assert prefix_pairs, "expected consecutive turns without a context fold"
    for a, b in prefix_pairs:
        assert b[: len(a) - 1] == a[:-1]


def test_the_cache_estimate_sees_the_stable_prefix() -> None:
    h, session, _ = _harness("E")

    async def go() -> list[int]:
        await h.setup(session)
        return [(await h.turn(_history(n), session)).cached_prompt_tokens for n in (0, 2, 4)]

    cached = anyio.run(go)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])


def test_level_a_is_the_plain_agent_request_for_request() -> None:
    h, session, backend = _harness("A")
    assert isinstance(h, PlainAgent)
    r = anyio.run(h.turn, _history(4), session)
    config = _config()
    frame = Viewer("client", client_system_prompt(PERSONA.card, config.dialogue.responder_role))
    # Exactly the request of a plain agent: its frame, the projection, its turn's seed.
    assert backend.requests == [ChatRequest(
        messages=tuple(project(_history(4), frame, "ecp")),
        temperature=config.backends["fake"].temperatures.client,
        max_tokens=config.dialogue.max_tokens, seed=derive_seed(7, 4, "client"),
    )]
    assert r.reproducible and r.stored_messages() is None and r.attempts == 1
    assert r.notes is None  # no harness record: no state, verdict or fallbacks


def test_levels_b_to_e_wrap_the_plain_agent() -> None:
    for level in "BCDE":
        h, _, _ = _harness(level)
        assert isinstance(h, HarnessedAgent) and isinstance(h.inner, PlainAgent)


def test_the_responder_is_handed_no_persona() -> None:
    # build_agents gives the Client its persona and the Responder none, at every level.
    for level in "BCDE":
        config = _config()
        spec = DialogueSpec(dialogue_id="d1", persona=PERSONA, conversation_index=0, condition="ecp",
                            pairing=config.pairing_list[0], seed=7, levels=(level, level))
        client, responder = build_agents(spec, config)
        assert isinstance(client, HarnessedAgent) and client.persona is PERSONA
        assert isinstance(responder, HarnessedAgent) and responder.persona is None


def test_the_responder_never_sees_the_client_persona() -> None:
    h, session, backend = _harness("E", speaker="responder")

    async def go() -> None:
        await h.setup(session)
        for n in range(1, 10, 2):
            await h.turn(_history(n), session)

    anyio.run(go)
    sent = json.dumps([list(r.messages) for r in backend.requests])
    for secret in ("(card text)", "Nurse", "nurse", "Lyon, France", PERSONA.fields["concern"],
                   "Mei,", "You have owned the machine"):
        assert secret not in sent, secret
