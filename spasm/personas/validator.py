"""Persona validator: declarative rules from the schema, then an optional LLM verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from spasm.personas.schema import PersonaSchema

if TYPE_CHECKING:
    from spasm.backends.base import Message


class PersonaVerdict(BaseModel):
    """The structured verdict of the LLM check (the persona stage's optional LLM check)."""

    # The title is part of the JSON schema sent to the model, and so of the request hashes.
    model_config = ConfigDict(extra="ignore", title="Verdict")

    valid: bool
    reason: str


def rule_violations(schema: PersonaSchema, fields: dict[str, Any]) -> list[str]:
    """Reasons the schema's rules reject a candidate's ``fields`` (empty when it passes)."""
    return [r for rule in schema.rules if (r := rule.violation(fields)) is not None]


def llm_validation_messages(fields: dict[str, Any]) -> list[Message]:
    """The prompt of the optional LLM coherence check of a candidate's ``fields``."""
    lines = "\n".join(f"- {k}: {v}" for k, v in fields.items())
    return [
        {
            "role": "system",
            "content": "You check whether a persona for a simulated conversation is coherent and "
            "plausible as a real person. Answer with a JSON object {\"valid\": true|false, "
            "\"reason\": \"one sentence\"}.",
        },
        {"role": "user", "content": f"Persona:\n{lines}\n\nIs this persona coherent?"},
    ]
