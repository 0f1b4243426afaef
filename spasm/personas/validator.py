"""Persona validator: declarative rules from the schema, then an optional LLM verdict."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from spasm.personas.schema import PersonaSchema


class PersonaVerdict(BaseModel):
    """The structured verdict of the LLM check (the persona stage's optional LLM check)."""

    # The title keeps the JSON schema sent to the model (and so the request hashes) as it was.
    model_config = ConfigDict(extra="ignore", title="Verdict")

    valid: bool
    reason: str


def rule_violations(schema: PersonaSchema, persona: dict[str, Any]) -> list[str]:
    """Reasons the schema's rules reject ``persona`` (empty when it passes)."""
    return [r for rule in schema.rules if (r := rule.violation(persona)) is not None]


def llm_validation_messages(persona: dict[str, Any]) -> list[dict[str, str]]:
    """The prompt of the optional LLM coherence check."""
    lines = "\n".join(f"- {k}: {v}" for k, v in persona.items())
    return [
        {
            "role": "system",
            "content": "You check whether a persona for a simulated conversation is coherent and "
            "plausible as a real person. Answer with a JSON object {\"valid\": true|false, "
            "\"reason\": \"one sentence\"}.",
        },
        {"role": "user", "content": f"Persona:\n{lines}\n\nIs this persona coherent?"},
    ]
