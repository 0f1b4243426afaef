"""Synthetic run directories for tests, demos and the evaluation benchmark.

:func:`write_run` turns plain Python records into the three Parquet tables that
``spasm eval`` reads; :func:`synthesize_run` makes a large, varied, realistic-looking run
(personas with concerns and emotions, 9-utterance dialogues under ECP and CONCAT, with a
share of CONCAT dialogues in which the Client starts echoing the Responder's advice).
The text is template-made, not model-made: good for timing and plumbing, not for
conclusions about models.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spasm.dataset.importer import FIELD_ALIASES, persona_columns
from spasm.dataset.persona_rows import persona_record
from spasm.dataset.rows import SCHEMA_VERSION, DialogueRow, TurnRow
from spasm.dataset.store import write_finished_run
from spasm.errors import FormatError
from spasm.personas.persona import Persona

__all__ = ["synthesize_run", "write_run"]

_PERSONA_FIXED = ("persona_id", "card")


def _described(p: Mapping[str, Any], index: int, columns: list[str], integer: set[str]) -> Persona:
    """The persona a :func:`write_run` persona dict describes (``persona_id``, ``card`` and
    schema fields, release names mapped like an import's)."""
    names = {FIELD_ALIASES.get(k, k) for k in p}
    unknown = sorted(names - set(columns) - set(_PERSONA_FIXED))
    if unknown:
        raise FormatError(f"persona {p.get('persona_id')!r} has fields the personas table does not "
                          f"declare: {', '.join(unknown)} (known: {', '.join(columns)})")
    fields = {k: v for k, v in p.items() if k not in _PERSONA_FIXED}
    return Persona(id=str(p["persona_id"]), index=index,
                   fields=persona_columns(fields, columns, integer),
                   card=str(p.get("card") or ""), card_source="synthetic")


def write_run(
    run_dir: str | Path,
    personas: Sequence[dict[str, Any]],
    dialogues: Sequence[dict[str, Any]],
) -> Path:
    """Write a complete run directory (personas, dialogues, turns) through the run store.

    Each persona dict holds ``persona_id``, ``card`` and persona-schema fields (release names
    such as ``name`` or ``location`` are mapped like an import's). Each dialogue dict holds the
    dialogues-table columns (``dialogue_id`` and ``persona_id`` at least; others get defaults)
    plus ``texts``: the utterances in order, the Client speaking first.
    """
    from spasm.personas.schema import load_schema

    run_dir = Path(run_dir)
    schema = load_schema(None)
    columns, integer = schema.field_names, schema.integer_fields()
    dialogue_rows, turn_rows = [], []
    for i, d in enumerate(dialogues):
        texts = [str(t) for t in d["texts"]]
        pairing = str(d.get("pairing", "smol/smol"))
        row = DialogueRow(
            dialogue_id=str(d["dialogue_id"]), persona_id=str(d["persona_id"]),
            conversation_index=int(d.get("conversation_index", 0)),
            condition=d.get("condition", "ecp"), harness_level=d.get("harness_level", "A"),
            pairing=pairing, client_backend=d.get("client_backend", pairing.split("/")[0]),
            client_model=d.get("client_model", "smollm2-135m"),
            responder_backend=d.get("responder_backend", pairing.split("/")[-1]),
            responder_model=d.get("responder_model", "smollm2-135m"),
            seed=int(d.get("seed", i)), n_utterances=len(texts),
            termination_reason=d.get("termination_reason", "natural_rule"),
            status=d.get("status", "ok"),
        )
        dialogue_rows.append(row)
        turn_rows += [TurnRow(dialogue_id=row.dialogue_id, turn_index=t, text=text,
                              speaker="client" if t % 2 == 0 else "responder")
                      for t, text in enumerate(texts)]
    persona_rows = [persona_record(_described(p, i, columns, integer)) for i, p in enumerate(personas)]
    manifest = {"kind": "synthetic", "schema_version": SCHEMA_VERSION,
                "counts": {"personas": len(persona_rows), "dialogues": len(dialogue_rows),
                           "turns": len(turn_rows)}}
    write_finished_run(run_dir, {"personas": persona_rows, "dialogues": dialogue_rows,
                                 "turns": turn_rows}, manifest,
                       persona_fields=(columns, integer), replace=True)
    return run_dir


# --------------------------------------------------------------------------- vocabulary

_DOMAINS = [
    ("retirement savings", "my pension pot", "a pension adviser"),
    ("a broken washing machine under warranty", "the washing machine", "the repair desk"),
    ("a disputed phone bill", "the roaming charges on my bill", "billing support"),
    ("renting a first flat", "the deposit for the flat", "the letting agent"),
    ("a delayed flight refund", "the refund for my cancelled flight", "the airline"),
    ("learning to code in Python", "my Python exercises", "my tutor"),
    ("sleep problems", "my sleep", "the counsellor"),
    ("a car insurance claim", "the insurance claim for my car", "the claims handler"),
    ("a tax return", "my self-assessment tax return", "the tax helpline"),
    ("a gym membership cancellation", "cancelling my gym membership", "the gym"),
    ("a child's school admission", "my daughter's school place", "the admissions office"),
    ("a slow home broadband line", "my broadband speed", "the internet provider"),
]
_OCCUPATIONS = [
    "nurse",
    "electrician",
    "teacher",
    "bus driver",
    "accountant",
    "chef",
    "software tester",
    "pharmacist",
    "plumber",
    "student",
    "retail manager",
    "farmer",
    "librarian",
    "paramedic",
    "graphic designer",
    "carpenter",
]
_CITIES = [
    "Leeds",
    "Lyon",
    "Austin",
    "Porto",
    "Osaka",
    "Gdansk",
    "Cork",
    "Denver",
    "Turin",
    "Bristol",
    "Ghent",
    "Perth",
    "Tampere",
    "Valencia",
    "Halifax",
    "Brno",
]
_EMOTIONS = [
    "anxious",
    "frustrated",
    "hopeful",
    "confused",
    "angry",
    "sad",
    "overwhelmed",
    "curious",
    "impatient",
    "embarrassed",
    "relieved",
    "sceptical",
]
_INTENSITIES = ["mild", "moderate", "severe"]
_MOTIVES = [
    "I want this sorted before the end of the month",
    "my family depends on me getting this right",
    "I have been let down before and want a straight answer",
    "I need to plan my budget for next year",
    "a friend told me I might be entitled to more",
    "I want to understand my options before I decide",
]
_NAMES = [
    "Ana",
    "Ben",
    "Chloe",
    "Dev",
    "Elif",
    "Femi",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Luca",
    "Maya",
    "Nils",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
]

_OPEN = [
    "Hi, I'm {name}, a {occupation} from {city}. I'm {emotion} about {thing}.",
    "Hello. I need some help with {thing}; honestly I'm feeling {emotion}.",
    "Good morning. I'm calling about {thing} and I'm quite {emotion}, to be honest.",
    "Hey, so this is about {thing}. I'm a {occupation} and I don't have much time.",
]
_CLIENT_FOLLOW = [
    "It started about {n} weeks ago and nobody has given me a clear answer.",
    "The problem is that {thing} keeps getting worse, and I'm worried it will cost me {n}00.",
    "I already spoke to {who} twice and they told me two different things.",
    "Can you tell me what my options are? {motive}.",
    "I'm not sure I follow. What exactly would I have to do next?",
    "That sounds complicated. Is there a simpler way, given that I work {n} shifts a week?",
    "Okay, but what happens if that doesn't work? I can't afford to lose {n}00.",
    "Fine. I'll try that, but I'm still {emotion} about it.",
    "Thanks, that helps a bit. Should I write this down or will you email it?",
    "Right. And how long does that usually take in {city}?",
    "I don't want to be difficult, but last time this took {n} months.",
    "Honestly I just want {thing} to be over with.",
]
_RESPONDER = [
    "I'm sorry to hear that. Could you tell me when you first noticed the issue with {thing}?",
    "Thanks for explaining. The first step is to gather any paperwork related to {thing}.",
    "I understand. Usually {who} can review this within {n} working days.",
    "That's a fair question. You have two options: ask for a formal review, or request a "
    "written summary of {thing} and decide after that.",
    "Let me check the details. In most cases like yours the fee is waived after {n} weeks.",
    "I can send you a summary by email so you don't have to write everything down.",
    "It's normal to feel {emotion} about this. We'll go through it one step at a time.",
    "If that doesn't work, you can escalate to a supervisor and they'll respond in {n} days.",
    "Good idea. Keep a note of the dates and the names of the people you speak to.",
    "I've noted everything on your file, reference {n}{n}7-{n}2.",
]
_ADVICE = [
    "First, gather every document about {thing}. Second, ask {who} for a written "
    "summary. Third, keep a log of every call with dates and names.",
    "Here are some steps you can take: 1. check the terms for {thing}. 2. request a formal "
    "review. 3. escalate to a supervisor after {n} days.",
    "I'd recommend requesting a formal review of {thing} and keeping copies of everything you send to {who}.",
]
_ECHO = [
    "You should gather every document about {thing} and ask {who} for a written summary. "
    "Is there anything else I can help you with?",
    "Here are some steps you can take:\n1. Check the terms for {thing}.\n2. Request a formal "
    "review.\n3. Escalate to a supervisor after {n} days.\nHow can I help you further?",
    "I understand your concern. I'd recommend requesting a formal review of {thing} and "
    "keeping copies of everything you send to {who}. Have you tried that already?",
]


_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_RELATIVES = ["sister", "neighbour", "colleague", "father", "partner", "friend", "son", "aunt"]
# Details with numbers and dates make almost every utterance unique, as in real dialogues
# (so the embedding cache cannot flatter the benchmark).
_CLIENT_DETAIL = [
    "My reference number is {ref}.",
    "I paid {amount} pounds on {day} {month}.",
    "I've been a customer for {years} years and never had this before.",
    "The last time I called was on {day} {month}, around {hour} o'clock.",
    "My {relative} said I should ask about {thing} directly.",
    "I can only talk after {hour} pm on weekdays because of work.",
    "On {day} {month} I got a letter saying something completely different.",
    "It's already cost me about {amount} pounds in extra expenses.",
]
_RESPONDER_DETAIL = [
    "Your case number is {ref}.",
    "I can see a payment of {amount} pounds on {day} {month}.",
    "The standard processing time is {years} working days, so expect an update by {day} {month}.",
    "I've added a note for my colleague in {city} to call you after {hour} pm.",
    "I've logged this call on {day} {month} under reference {ref}.",
    "Customers in a similar situation usually get about {amount} pounds back.",
]


def _persona(rng: random.Random, i: int) -> dict[str, Any]:
    domain, thing, who = rng.choice(_DOMAINS)
    emotion, intensity = rng.choice(_EMOTIONS), rng.choice(_INTENSITIES)
    name, occupation, city = rng.choice(_NAMES), rng.choice(_OCCUPATIONS), rng.choice(_CITIES)
    age = rng.randint(18, 65)
    motive = rng.choice(_MOTIVES)
    concern = f"Getting {thing} resolved without losing money or time"
    card = (
        f"You are {name}, a {age}-year-old {occupation} living in {city}. You are contacting "
        f"{who} about {domain}. You feel {emotion} ({intensity}). Your main concern: "
        f"{concern.lower()}. Your motivation: {motive}."
    )
    return {
        "persona_id": f"p{i:04d}",
        "first_name": name,
        "age": age,
        "occupation": occupation,
        "city": city,
        "domain": domain,
        "concern": concern,
        "motivation": motive,
        "emotion": emotion,
        "intensity": intensity,
        "verbosity": rng.choice(["terse", "average", "chatty"]),
        "directness": rng.choice(["indirect", "balanced", "blunt"]),
        "cooperativeness": rng.choice(["low", "medium", "high"]),
        "formality": rng.choice(["casual", "neutral", "formal"]),
        "card": card,
        "_thing": thing,
        "_who": who,
    }


def _fill(template: str, p: dict[str, Any], rng: random.Random) -> str:
    return template.format(
        name=p["first_name"],
        occupation=p["occupation"],
        city=p["city"],
        emotion=p["emotion"],
        thing=p["_thing"],
        who=p["_who"],
        motive=p["motivation"],
        n=rng.randint(2, 9),
        ref=f"{rng.choice('ABCDEFGHJK')}{rng.randint(10000, 99999)}",
        amount=rng.randint(12, 2400),
        day=rng.randint(1, 28),
        month=rng.choice(_MONTHS),
        years=rng.randint(2, 19),
        hour=rng.randint(1, 9),
        relative=rng.choice(_RELATIVES),
    )


def _say(pools: Sequence[Sequence[str]], p: dict[str, Any], rng: random.Random) -> str:
    return " ".join(_fill(rng.choice(pool), p, rng) for pool in pools)


def synthesize_run(
    run_dir: str | Path,
    *,
    n_dialogues: int = 5000,
    n_personas: int = 200,
    n_utterances: int = 9,
    echo_share_concat: float = 0.3,
    pairings: Sequence[str] = ("gpt/gpt", "gpt/deepseek"),
    seed: int = 0,
) -> Path:
    """Write a synthetic run of ``n_dialogues`` dialogues (half ECP, half CONCAT, paired).

    Each persona gets conversations spread over ``pairings``; a CONCAT dialogue echoes
    (the Client repeats the Responder's advice in the Responder's voice from its third
    turn on) with probability ``echo_share_concat``.
    """
    rng = random.Random(seed)
    personas = [_persona(rng, i) for i in range(n_personas)]
    dialogues: list[dict[str, Any]] = []
    n_pairs = n_dialogues // 2
    for k in range(n_pairs):
        p = personas[k % n_personas]
        pairing = pairings[(k // n_personas) % len(pairings)]
        conv_index = k // (n_personas * len(pairings))
        for condition in ("ecp", "concat"):
            echo = condition == "concat" and rng.random() < echo_share_concat
            texts: list[str] = []
            for t in range(n_utterances):
                if t == 0:
                    text = _say([_OPEN, _CLIENT_FOLLOW, _CLIENT_DETAIL], p, rng)
                elif t % 2 == 1:
                    main = _ADVICE if t == 3 or rng.random() < 0.2 else _RESPONDER
                    text = _say([_RESPONDER, main, _RESPONDER_DETAIL][rng.randint(0, 1) :], p, rng)
                elif echo and t >= 4:
                    text = _say([_ECHO, _RESPONDER_DETAIL], p, rng)
                else:
                    pools = [_CLIENT_FOLLOW] * rng.randint(1, 2)
                    text = _say([*pools, _CLIENT_DETAIL], p, rng)
                texts.append(text)
            dialogues.append(
                {
                    "dialogue_id": f"d{k:05d}-{condition}",
                    "persona_id": p["persona_id"],
                    "conversation_index": conv_index,
                    "condition": condition,
                    "pairing": pairing,
                    "client_backend": pairing.split("/")[0],
                    "responder_backend": pairing.split("/")[1],
                    "seed": seed,
                    "texts": texts,
                }
            )
    public = [{k: v for k, v in p.items() if not k.startswith("_")} for p in personas]
    return write_run(run_dir, public, dialogues)
