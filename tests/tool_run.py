"""A small run of agents that act, written by hand through spasm's own store.

Two dialogues of one persona and scenario, ECP and CONCAT, each with the Responder's lookup
(visible to it alone; the Client is shown a notice), the Client's own action (dual control:
it checks its bank app, visible to it alone) and a change of the world. In the CONCAT
dialogue the Client then repeats the tracking number only the Responder's lookup returned
(a payload leak); in the ECP dialogue it repeats only what it was told or saw itself. The
events, worlds and reward columns are those of the format (docs/format.md, 1.9); the tools
are a real module (``tools.py`` beside the run) that config.json names, like a generated run's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spasm.dataset.rows import SCHEMA_VERSION
from spasm.dataset.store import write_finished_run
from spasm.personas.schema import load_schema
from spasm.tools import canonical_json, world_sha256

TOOLS_PY = '''
import spasm


@spasm.tool(owner="responder", notice="[The agent is looking up your order]")
def lookup_order(world: dict, order_id: str) -> dict:
    """Look an order up by its id.

    Args:
        order_id: The order's id, as the customer gives it.
    """
    return world["orders"][order_id]


@spasm.tool(owner="responder", mutates=True, notice="[The agent is updating your order]")
def reship_order(world: dict, order_id: str, express: bool = False) -> dict:
    """Send an order again.

    Args:
        order_id: The order's id.
        express: Ship it express.
    """
    world["orders"][order_id]["status"] = "reshipped"
    return {"ok": True}


@spasm.tool(owner="client")
def check_bank_app(world: dict) -> dict:
    """Open your bank app and read the last payment."""
    return {"last_payment": world["bank"]["last_payment"]}
'''

CLIENT_PROMPT = ("You are Ana, 34, a nurse in Porto. Your order A-1001 has not arrived. Your "
                 "goal: get it sent again. Speak as yourself.")
RESPONDER_PROMPT = "You are a customer-service agent of an online shop. Use your tools."
INITIAL = {"orders": {"A-1001": {"status": "shipped", "tracking": "TRK-99812"}},
           "bank": {"last_payment": "49.90"}}
RESHIPPED = {"orders": {"A-1001": {"status": "reshipped", "tracking": "TRK-99812"}},
             "bank": {"last_payment": "49.90"}}


def _event(did: str, seq: int, turn: int, kind: str, actor: str, visible: list[str],
           **fields: Any) -> dict[str, Any]:
    return {"dialogue_id": did, "seq": seq, "turn_index": turn, "kind": kind, "actor": actor,
            "visible_to": json.dumps(visible), **fields}


def _events(did: str, reship: bool) -> list[dict[str, Any]]:
    lookup = {"order_id": "A-1001"}
    out = [
        _event(did, 0, 1, "tool_call", "responder", ["responder"], call_id="call_1",
               tool="lookup_order", arguments=canonical_json(lookup)),
        _event(did, 1, 1, "notice", "responder", ["client"], call_id="call_1",
               tool="lookup_order", notice="[The agent is looking up your order]"),
        _event(did, 2, 1, "tool_result", "responder", ["responder"], call_id="call_1",
               tool="lookup_order", result=canonical_json(INITIAL["orders"]["A-1001"]),
               world_sha256=world_sha256(INITIAL)),
        _event(did, 3, 2, "tool_call", "client", ["client"], call_id="call_2",
               tool="check_bank_app", arguments="{}"),
        _event(did, 4, 2, "tool_result", "client", ["client"], call_id="call_2",
               tool="check_bank_app", result=canonical_json({"last_payment": "49.90"}),
               world_sha256=world_sha256(INITIAL)),
    ]
    if reship:
        final = RESHIPPED
        out += [
            _event(did, 5, 3, "tool_call", "responder", ["responder"], call_id="call_3",
                   tool="reship_order", arguments=canonical_json({"order_id": "A-1001"})),
            _event(did, 6, 3, "notice", "responder", ["client"], call_id="call_3",
                   tool="reship_order", notice="[The agent is updating your order]"),
            _event(did, 7, 3, "tool_result", "responder", ["responder"], call_id="call_3",
                   tool="reship_order", result=canonical_json({"ok": True}),
                   world_sha256=world_sha256(final)),
        ]
    return out


def _worlds(did: str, reship: bool) -> list[dict[str, Any]]:
    final = RESHIPPED if reship else INITIAL
    rows = [{"dialogue_id": did, "seq": 0, "kind": "initial", "event_seq": None,
             "world_sha256": world_sha256(INITIAL), "world": canonical_json(INITIAL)}]
    if reship:
        rows.append({"dialogue_id": did, "seq": 1, "kind": "change", "event_seq": 7,
                     "world_sha256": world_sha256(final), "world": canonical_json(final)})
    rows.append({"dialogue_id": did, "seq": len(rows), "kind": "final", "event_seq": None,
                 "world_sha256": world_sha256(final), "world": canonical_json(final)})
    rows.append({"dialogue_id": did, "seq": len(rows), "kind": "gold", "event_seq": None,
                 "world_sha256": world_sha256(RESHIPPED), "world": canonical_json(RESHIPPED)})
    return rows


#: The utterances of each condition's dialogue.
TEXTS = {
    "ecp": ["Hi, my order A-1001 has not arrived.",
            "Let me check. It shipped last week.",
            "My bank app says I paid 49.90. Can you send it again?",
            "Done: I have sent it again."],
    "concat": ["Hi, my order A-1001 has not arrived.",
               "Let me check. It shipped last week.",
               "Is TRK-99812 the tracking number? My bank app says 49.90.",
               "Let me look into it further."],
}
IDS = {c: f"p0-k0-slate-srv-srv-{c}" for c in TEXTS}


def write_tool_run(run_dir: Path) -> Path:
    """Write the run to ``run_dir`` (its tools module beside it) and return it."""
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tools_py = run_dir.parent / "shop_tools.py"
    tools_py.write_text(TOOLS_PY, encoding="utf-8")
    schema = load_schema(None)
    persona = {"persona_id": "p0", "persona_index": 0, "seed": 0, "card": CLIENT_PROMPT,
               "first_name": "Ana"}
    dialogues, turns, events, worlds = [], [], [], []
    for condition, texts in TEXTS.items():
        did = IDS[condition]
        reship = condition == "ecp"
        dialogues.append({
            "dialogue_id": did, "persona_id": "p0", "conversation_index": 0,
            "condition": condition, "pairing": "srv/srv", "client_backend": "srv",
            "client_model": "m", "responder_backend": "srv", "responder_model": "m",
            "seed": 7, "responder_role": "customer-service agent",
            "client_system_prompt": CLIENT_PROMPT, "responder_system_prompt": RESPONDER_PROMPT,
            "n_utterances": len(texts), "termination_reason": "natural_rule",
            "scenario_id": "late", "goal_met": reship, "goal_reason": "judged",
            "reward": 1.0 if reship else 0.0, "world_match": reship,
            "reward_detail": json.dumps({"world": 1.0 if reship else 0.0}),
        })
        turns += [{"dialogue_id": did, "turn_index": i, "text": t,
                   "speaker": "client" if i % 2 == 0 else "responder"}
                  for i, t in enumerate(texts)]
        events += _events(did, reship)
        worlds += _worlds(did, reship)
    manifest = {"kind": "fixture", "schema_version": SCHEMA_VERSION, "status": "complete"}
    write_finished_run(run_dir, {"personas": [persona], "dialogues": dialogues, "turns": turns,
                                 "events": events, "worlds": worlds}, manifest,
                       persona_fields=(schema.field_names, schema.integer_fields()), replace=True)
    config = {"name": "tools", "seed": 7, "conditions": ["ecp", "concat"],
              "tools": [str(tools_py)], "scenarios": [
                  {"id": "late", "situation": "Your order A-1001 has not arrived.",
                   "goal": "Get it sent again.", "expected_outcome": "The agent reships it."}]}
    (run_dir / "config.json").write_text(json.dumps({"fingerprint": "fixture",
                                                     "config": config}), encoding="utf-8")
    return run_dir
