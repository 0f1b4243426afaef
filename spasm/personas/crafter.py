"""Persona crafter: renders the fields into a natural-language card (the card templates of
the persona schema).

The template card is deterministic. An optional LLM rewrite (temperature 0.7) turns it into
richer prose; both the card and the fields are stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spasm.backends.base import Message

_STYLE = {
    "verbosity": {
        "terse": "You write short, clipped messages.",
        "moderate": "Your messages are of ordinary length.",
        "verbose": "You tend to write long messages with extra detail.",
    },
    "directness": {
        "indirect": "You hint at what you want rather than saying it outright.",
        "balanced": "You are reasonably clear about what you want.",
        "direct": "You say exactly what you want.",
    },
    "cooperativeness": {
        "resistant": "You are slow to accept suggestions and often push back.",
        "neutral": "You weigh suggestions before accepting them.",
        "cooperative": "You readily go along with reasonable suggestions.",
    },
    "formality": {
        "casual": "Your tone is casual.",
        "neutral": "Your tone is plain and polite.",
        "formal": "Your tone is formal.",
    },
}
_VERB = {"wants": "want", "needs": "need", "is": "are", "has": "have"}
#: ``language`` is not a trait of the card: the frames ask for it (spasm.agents), so a persona
#: whose language is English has the card of a schema without the field.
_KNOWN = {
    "first_name", "age", "occupation", "city", "domain", "concern", "motivation", "emotion",
    "intensity", "language", *_STYLE,
}


def _second_person(motivation: str) -> str:
    head, _, rest = motivation.partition(" ")
    return f"{_VERB.get(head, head)} {rest}".strip()


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def render_persona_card(fields: dict[str, Any]) -> str:
    """The template card of a candidate's ``fields``, in the second person, as the Client's
    system prompt starts."""
    p = fields
    parts: list[str] = []
    identity = ""
    if "age" in p and "occupation" in p:
        occupation = str(p["occupation"]).lower() if p["occupation"][1:].islower() else p["occupation"]
        identity = f"a {p['age']}-year-old {occupation}"
    if p.get("city"):
        identity += f" living in {p['city']}"
    if p.get("first_name"):  # a schema without these fields gets no "You are ." sentence
        parts.append(f"You are {p['first_name']}, {identity}." if identity else
                     f"You are {p['first_name']}.")
    elif identity:
        parts.append(f"You are {identity.strip()}.")
    if p.get("domain"):
        topic = f"You have come to talk about {p['domain']}"
        if p.get("concern"):
            topic += f". In your own words, your concern is: \"{p['concern']}\""
        parts.append(topic + ".")
    if p.get("emotion"):
        intensity = p.get("intensity")
        feeling = f"{intensity} " if intensity and intensity != "moderate" else ""
        if intensity == "mild":
            feeling = "slightly "
        elif intensity == "severe":
            feeling = "very "
        parts.append(f"Right now you feel {feeling}{p['emotion']} about it.")
    if p.get("motivation"):
        parts.append(f"In this conversation you {_second_person(str(p['motivation']))}.")
    for dim, phrases in _STYLE.items():
        if p.get(dim) in phrases:
            parts.append(phrases[p[dim]])
    extra = [f"{k.replace('_', ' ')}: {v}" for k, v in p.items() if k not in _KNOWN]
    if extra:
        parts.append("Other traits: " + "; ".join(extra) + ".")
    return " ".join(parts)


def rewrite_messages(card: str) -> list[Message]:
    """The prompt of the optional LLM rewrite into richer prose."""
    return [
        {
            "role": "system",
            "content": "Rewrite persona descriptions into vivid, natural second-person prose "
            "(\"You are …\"). Keep every fact; add no new facts about age, job, place, topic, "
            "feelings or goals. Reply with the rewritten description only.",
        },
        {"role": "user", "content": card},
    ]
