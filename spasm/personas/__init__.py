"""Persona definitions: schema, sampler, rules and card templates (README, "Bring your own
personas"). They call no model; the stage that does (LLM validation, crafting, policies) is
:mod:`spasm.persona_stage`."""

from __future__ import annotations

from spasm.personas.crafter import render_persona_card
from spasm.personas.sampler import sample_candidate
from spasm.personas.schema import PersonaSchema, load_schema
from spasm.personas.validator import rule_violations

__all__ = [
    "PersonaSchema",
    "load_schema",
    "render_persona_card",
    "rule_violations",
    "sample_candidate",
]
