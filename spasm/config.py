"""Run configuration: pydantic models with ``extra="forbid"`` so a typo is an error.

A run config is YAML (or JSON). :func:`load_config` reads one and turns validation errors into a
:class:`~spasm.errors.ConfigError` that names the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spasm.errors import ConfigError
from spasm.redact import redact_url
from spasm.registry import BACKENDS, DETECTORS, NEXT_SPEAKERS, PROJECTIONS

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"

#: The seeds a run (``seed``, ``--seed``, ``spasm personas --seed``) may have: what a signed
#: 64-bit column holds.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Temperatures(_Strict):
    """Sampling temperature per role."""

    client: float = Field(0.7, ge=0, le=2)
    responder: float = Field(0.7, ge=0, le=2)
    judge: float = Field(0.3, ge=0, le=2)
    validator: float = Field(0.3, ge=0, le=2)
    crafter: float = Field(0.7, ge=0, le=2)


class Prices(_Strict):
    """Token prices in the currency of your bill, per million tokens."""

    input_per_1m: float = Field(0.0, ge=0)
    output_per_1m: float = Field(0.0, ge=0)
    #: Prompt tokens the provider reports as served from its prefix cache
    #: (``prompt_tokens_details.cached_tokens``); ``None``: billed like other input tokens.
    cached_input_per_1m: float | None = Field(None, ge=0)

    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0) -> float:
        """What a call's tokens cost: cached prompt tokens at the cached price."""
        cached_price = self.input_per_1m if self.cached_input_per_1m is None else self.cached_input_per_1m
        cached = min(cached_tokens, prompt_tokens)
        return (
            (prompt_tokens - cached) * self.input_per_1m + cached * cached_price
            + completion_tokens * self.output_per_1m
        ) / 1e6


StructuredOutputMode = Literal["auto", "json_schema", "json_object", "text"]


#: A ``python`` backend's target: a module or a ``.py`` file, ``:``, a function (or an
#: attribute path to one, ``Bot.respond``).
_TARGET_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def check_target(target: str) -> str:
    """Validate a ``python`` backend's ``target`` (``package.module:function`` or
    ``path/to/file.py:function``); returns it, or raises ValueError saying the form."""
    where, colon, function = target.strip().rpartition(":")
    form = ("target is 'package.module:function' (an importable module) or "
            "'path/to/file.py:function'")
    if not colon or not where or not _TARGET_FUNCTION.match(function):
        raise ValueError(f"{form}; got {target!r}")
    if not where.endswith(".py") and not _TARGET_FUNCTION.match(where):
        raise ValueError(f"{form}; got {target!r} ({where!r} is neither a dotted module name nor "
                         "a .py file)")
    return target.strip()


class BackendConfig(_Strict):
    """One model backend: an OpenAI-compatible endpoint, the embedded model, or a Python
    function (``kind: python``: your agent under test)."""

    #: A registered backend kind (:func:`spasm.backends.register_backend`): ``openai``,
    #: ``embedded`` or ``python`` unless a plugin adds one.
    kind: str = "openai"
    model: str = EMBEDDED_MODEL
    base_url: str | None = None
    #: The NAME of the environment variable holding the key; the key itself never enters config.
    api_key_env: str | None = None
    max_concurrency: int = Field(16, ge=1, le=10_000)
    rpm: int | None = Field(None, ge=1, description="requests per minute cap")
    tpm: int | None = Field(None, ge=1, description="tokens per minute cap")
    timeout_s: float = Field(60.0, gt=0)
    max_attempts: int = Field(6, ge=1, le=20)
    temperatures: Temperatures = Temperatures()
    prices: Prices = Prices()
    #: Embedded only: llama.cpp threads (defaults to the machine's cores) and context size.
    n_threads: int | None = Field(None, ge=1)
    n_ctx: int = Field(8192, ge=512)
    model_path: str | None = None
    #: How structured calls are sent: ``json_schema`` (``response_format`` json_schema: OpenAI,
    #: vLLM, SGLang), ``json_object`` (``response_format`` json_object with a ``schema`` field,
    #: plus the schema in the prompt: llama.cpp's server, DeepSeek), ``text`` (the schema in the
    #: prompt only; the JSON is parsed out of the reply), or ``auto``: the strictest the server
    #: takes, found on the first structured call and kept for the run. The embedded model always
    #: uses its llama.cpp grammar.
    structured_output: StructuredOutputMode = "auto"
    #: ``python`` only: the function that writes the replies, ``package.module:function`` or
    #: ``path/to/file.py:function`` (a relative path is read from the working directory);
    #: called as ``fn(messages, context)`` (:mod:`spasm.backends.python`).
    target: str | None = None
    #: A run with tools: how a tool step is asked. ``native`` sends ``tools`` and reads the
    #: reply's ``tool_calls`` (OpenAI, vLLM, SGLang, a ``python`` function); ``prompted``
    #: describes the tools in the frame and asks through the structured-output path for a
    #: message or calls (a server without native tools); ``auto``: prompted for the embedded
    #: model, native otherwise.
    tool_mode: Literal["auto", "native", "prompted"] = "auto"
    #: ``python`` only: the function's reply depends on the messages and the seed alone, so a
    #: rerun may replay it from the cache. Off by default: replies of code are not cached.
    deterministic: bool = False
    #: ``human`` only (a person in the seat, ``spasm play``): the person's pseudonym as the
    #: run records it (never a real name by default) and how they take part.
    operator: str | None = None
    interface: Literal["terminal", "web", "import"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _python_model(cls, data: Any) -> Any:
        # A python backend's model name is its target unless one is given (the dialogues
        # table records it as the responder's or client's model).
        if (isinstance(data, dict) and data.get("kind") == "python" and "model" not in data
                and isinstance(data.get("target"), str)):
            return {**data, "model": data["target"]}
        if isinstance(data, dict) and data.get("kind") == "human" and "model" not in data:
            return {**data, "model": "human"}  # a person is no model
        return data

    @field_validator("target")
    @classmethod
    def _target_form(cls, v: str | None) -> str | None:
        return None if v is None else check_target(v)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown backend kind {v!r}; known: {BACKENDS.names()}")
        return v

    @model_validator(mode="after")
    def _check_kind(self) -> BackendConfig:
        if self.kind == "openai" and not self.base_url:
            raise ValueError("an 'openai' backend needs base_url (e.g. https://api.openai.com/v1)")
        if self.kind == "python" and self.target is None:
            raise ValueError("a 'python' backend needs target: the function that replies, "
                             "'package.module:function' or 'path/to/file.py:function'")
        if self.kind in ("openai", "embedded") and (self.target is not None or self.deterministic):
            raise ValueError("target and deterministic are settings of a 'python' backend "
                             f"(kind: python), not of an {self.kind!r} one")
        if self.kind != "human" and (self.operator is not None or self.interface is not None):
            raise ValueError("operator and interface are settings of a person's seat "
                             f"(kind: human), not of a {self.kind!r} backend")
        if self.api_key_env is not None and not self.api_key_env.replace("_", "").isalnum():
            raise ValueError(
                "api_key_env is the NAME of an environment variable (like OPENAI_API_KEY), "
                "not the key itself"
            )
        return self

    def shared(self, ways: int) -> BackendConfig:
        """This backend as one of ``ways`` callers running at once sees it: ``max_concurrency``,
        ``rpm`` and ``tpm`` divided by ``ways``, rounded down (at least 1), so the shares add
        up to at most the provider's limit (the Ray executor's shards, ``spasm eval --ray``'s
        judge tasks). Not part of any fingerprint."""
        if ways <= 1:
            return self
        return self.model_copy(update={
            "max_concurrency": max(1, self.max_concurrency // ways),
            "rpm": max(1, self.rpm // ways) if self.rpm else None,
            "tpm": max(1, self.tpm // ways) if self.tpm else None,
        })


def parallel_ways(backends: Iterable[BackendConfig], slots: int) -> int:
    """How many callers may run at once, at most ``slots``, so that each gets a whole share
    (:meth:`BackendConfig.shared`) of every backend's ``max_concurrency``, ``rpm`` and ``tpm``."""
    ways = max(1, slots)
    for b in backends:
        ways = min(ways, b.max_concurrency, *(v for v in (b.rpm, b.tpm) if v))
    return max(1, ways)


class PairingConfig(_Strict):
    """Which backend plays the Client and which the Responder."""

    client: str
    responder: str

    @property
    def label(self) -> str:
        return self.label_of(self.client, self.responder)

    @staticmethod
    def label_of(client: str, responder: str) -> str:
        """How rows name a client and a responder backend: ``client/responder`` (a group
        dialogue's row: its first client and first responder seats')."""
        return f"{client}/{responder}"


class PersonaConfig(_Strict):
    """Persona pipeline settings."""

    #: How many personas: drawn from the schema (default 4) or, with ``source``, rows drawn
    #: from the file with the run's seed (default: every row).
    n: int | None = Field(None, ge=1)
    #: Personas from a data file instead of the schema's sampler: CSV, JSONL, Parquet or a
    #: directory saved by ``datasets`` (:mod:`spasm.personas.sources`; a relative path is
    #: read from the working directory).
    source: str | None = None
    #: With ``source``: the file's column -> a schema field, ``card``, ``description`` or
    #: ``source_id`` (columns named like those need no entry).
    field_map: dict[str, str] = {}
    #: Path to a persona schema file; ``None`` uses the bundled ``schemas/persona.yaml``.
    schema_file: str | None = None
    llm_validate: bool = False
    llm_craft: bool = False
    #: Backend for the LLM validator/crafter; defaults to the run's helper backend (the first
    #: pairing's client, a group run's first client seat's: ``RunConfig.helper_backend``).
    backend: str | None = None
    #: Give up when this many candidates in a row fail for every n (rules reject nearly all).
    max_draws_per_persona: int = Field(200, ge=1)
    #: Plan dialogues for these persona ids only (every persona is still drawn and stored):
    #: ``spasm play`` plays one persona of a config this way. ``None``: every persona.
    ids: list[str] | None = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _default_n(cls, data: Any) -> Any:
        # Sampled personas default to 4; a source's default is all its rows (n stays None).
        if isinstance(data, dict) and data.get("source") is None and data.get("n") is None:
            return {**data, "n": 4}
        return data

    @model_validator(mode="after")
    def _check_source(self) -> PersonaConfig:
        if self.source is None:
            if self.field_map:
                raise ValueError("field_map renames the columns of personas.source; set source "
                                 "(a CSV, JSONL or Parquet file) or remove field_map")
            return self
        if not self.source.strip():
            raise ValueError("source is empty; name a CSV, JSONL or Parquet file of personas")
        if self.llm_validate or self.llm_craft:
            raise ValueError("llm_validate and llm_craft check and rewrite sampled personas; the "
                             "rows of personas.source are used as written (the schema's rules "
                             "still apply)")
        return self


class TerminationConfig(_Strict):
    """The termination detector chain."""

    rules: bool = True
    window: int = Field(4, ge=2, description="m: utterances the rules look at")
    min_utterances: int = Field(4, ge=2)
    judge: bool = False
    judge_backend: str | None = None
    #: More detectors by registered name (:func:`spasm.termination.register_detector`, e.g.
    #: from a plugin), run in this order after the rules and the judge.
    detectors: list[str] = []

    @field_validator("detectors")
    @classmethod
    def _known_detectors(cls, v: list[str]) -> list[str]:
        for name in v:
            if name in ("rules", "judge"):
                raise ValueError(f"{name!r} is switched on with termination.{name}: true, not "
                                 "listed in detectors")
            if name not in DETECTORS:
                raise ValueError(f"unknown termination detector {name!r}; known: "
                                 f"{[n for n in DETECTORS.names() if n not in ('rules', 'judge')]}"
                                 " (a plugin registers more)")
        if len(set(v)) != len(v):
            raise ValueError("detectors repeat")
        return v


class GoalJudgeConfig(_Strict):
    """The goal judge of a run with scenarios (:mod:`spasm.goals`): after each dialogue it
    decides whether the Client's goal was met (``dialogues.goal_met``, ``goal_reason``), and
    with ``termination`` it also ends a dialogue once the goal is reached (``goal_reached``)."""

    enabled: bool = True
    termination: bool = False
    #: Default: the dialogue's Client backend.
    backend: str | None = None
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(160, ge=32)


class DialogueConfig(_Strict):
    """How each dialogue is run."""

    max_turns_per_agent: int = Field(25, ge=1, le=100)
    responder_role: str = "customer-service agent"
    responder_instructions: str | None = None
    max_tokens: int = Field(200, ge=8, description="cap on each generated utterance")
    #: A run with tools: tool steps an agent may take within one turn before it must write
    #: its utterance (each step is a call; the last step offers no tools).
    max_tool_steps: int = Field(8, ge=0, le=64)


class EngineConfig(_Strict):
    """Run-engine settings (docs/engine.md)."""

    max_dialogues_in_flight: int | None = Field(
        None, ge=1, description="default: twice the request slots of the backends in use"
    )
    flush_every: int = Field(32, ge=1, description="completed dialogues per Parquet part")
    cache: bool = True
    max_cost: float | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    reask_attempts: int = Field(2, ge=0, le=5)
    #: A plan larger than this is refused before anything is sampled: the plan and the personas
    #: are held in memory (about 1 KB a dialogue), so a typo like 1000000000 must not start.
    max_planned_dialogues: int = Field(1_000_000, ge=1)


HarnessLevel = Literal["A", "B", "C", "D", "E"]


class HarnessConfig(_Strict):
    """The Persona Harness around each agent (docs/harness.md) and its A–E ablation.

    Levels: A persona prompt only (the projection of the whole history); B + rolling window
    and structured context of older turns; C + external state through the reducer (and the
    persona compiled into a policy); D + example retrieval; E + verify and rewrite.
    """

    client: HarnessLevel = "A"
    responder: HarnessLevel = "A"
    #: Sweep: one dialogue per level (both agents at it) for every persona, seed and condition.
    levels: list[HarnessLevel] | None = None
    window: int = Field(6, ge=2, le=100, description="utterances kept verbatim (level B and up)")
    stride: int = Field(
        4, ge=1, le=100, description="older utterances are summarised in steps of this many"
    )
    context: Literal["rules", "llm"] = "rules"
    #: Compile each card into its policy with an LLM call (role ``policy``); ``false`` uses
    #: only the baseline policy derived in code from the persona's fields (no call).
    extract_policy: bool = True
    #: Backend for the harness's own calls (policy, reducer, context, checker, probe);
    #: default: the backend of the agent being wrapped.
    backend: str | None = None
    temperature: float = Field(0.3, ge=0, le=2, description="harness structured calls")
    state_items: int = Field(4, ge=3, le=5, description="state items shown in the prompt")
    never_in_prompt: int = Field(5, ge=1, le=10, description="never-boundaries shown")
    examples: int = Field(4, ge=1, le=10, description="retrieved examples (SPEC: 4-5)")
    prefilter: int = Field(50, ge=1, le=10_000, description="lexical pre-filter size")
    corpus: str | None = Field(None, description="JSONL file of extra in-character examples")
    pass_threshold: int = Field(70, ge=0, le=100, description="checker: overall score to pass")
    boundary_floor: int = Field(50, ge=0, le=100, description="checker: boundary score to pass")
    reducer_max_tokens: int = Field(256, ge=32)
    checker_max_tokens: int = Field(192, ge=32)
    #: Level E's state update: ``merged`` — the checker's call also proposes the state changes
    #: the partner's message and the reviewed reply caused (one call a turn instead of two; the
    #: hard constraints apply unchanged); ``separate`` — a reducer call before each draft, as
    #: at levels C and D.
    review: Literal["merged", "separate"] = "separate"
    #: Run the checker on every accepted reply below level E too (role ``audit``, no rewrite),
    #: so the boundary-violation rate can be compared across levels.
    audit: bool = False
    #: After each dialogue, ask each agent what its partner said first (role ``probe``).
    recall_probe: bool = False
    #: Where the probes ask, as fractions of the dialogue: 0 is the partner's first message,
    #: 0.5 its first at or after the middle (one ``probe`` call per agent and depth).
    probe_depths: list[float] = Field(default_factory=lambda: [0.0], min_length=1, max_length=10)
    #: After each dialogue, ask the Client a few questions about itself built from its persona
    #: fields (role ``persona_probe``), for Q&A consistency in ``spasm eval --consistency``.
    persona_probes: bool = False

    @field_validator("probe_depths")
    @classmethod
    def _depths(cls, v: list[float]) -> list[float]:
        if any(not 0 <= d < 1 for d in v) or len(set(v)) != len(v):
            raise ValueError("probe_depths are distinct fractions in [0, 1), e.g. [0, 0.25, 0.5, 0.75]")
        return v

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("levels must be a non-empty list without repeats, e.g. [A, E]")
        return v

    @property
    def active(self) -> bool:
        """Whether anything differs from plain level-A generation."""
        return bool(
            (self.levels and self.levels != ["A"])
            or self.client != "A" or self.responder != "A" or self.audit or self.recall_probe
            or self.persona_probes
        )


#: A participant's id: a short name, as it stands in transcripts ("Ana: …") and dialogue ids.
PARTICIPANT_ID = r"^[A-Za-z][A-Za-z0-9_]{0,23}$"
#: Ids a participant cannot have (any case): the roles ``--role`` names, the chat roles a reply
#: prefix is cleaned of, and what a harnessed seat calls itself.
RESERVED_PARTICIPANT_IDS = frozenset({"client", "responder", "both", "user", "assistant", "system", "you"})


class ParticipantConfig(_Strict):
    """One seat of a group dialogue: a ``client`` seat is filled by a persona, a ``responder``
    seat speaks from its role and instructions."""

    id: str
    role: Literal["client", "responder"]
    backend: str
    #: A responder seat's role ("peer-support facilitator"; default ``dialogue.responder_role``)
    #: and extra instructions; a client seat's instructions are added to its frame.
    responder_role: str | None = None
    instructions: str | None = None
    #: The seat's harness level (A–E, docs/harness.md); the ``harness:`` block's settings (window,
    #: corpus, checker, audit, persona probes …) apply to every harnessed seat.
    level: HarnessLevel = "A"

    @field_validator("id")
    @classmethod
    def _id_form(cls, v: str) -> str:
        if not re.match(PARTICIPANT_ID, v):
            raise ValueError(
                f"participant id {v!r} is not allowed: an id is a short name as it stands in "
                "transcripts and dialogue ids: a letter, then up to 23 letters, digits or '_' "
                "(no spaces, '-' or accents), e.g. Ana, Ben_2, Facilitator")
        return v


class GroupConfig(_Strict):
    """How a group dialogue runs (with ``participants:``)."""

    #: A registered next-speaker policy (:mod:`spasm.turn_order`): ``round_robin``,
    #: ``addressed``, ``random``, ``llm`` or a plugin's.
    next_speaker: str = "round_robin"
    #: The dialogue ends at this many utterances if nothing ends it before.
    max_utterances: int = Field(12, ge=2, le=1000)
    #: Who speaks first (a participant id); default: the first participant.
    opener: str | None = None
    #: Whether a participant may speak twice in a row (``random`` and ``llm``).
    allow_repeat: bool = False
    #: How ECP names the other speakers: a "Name: " prefix, or the protocol's ``name`` field.
    speaker_names: Literal["prefix", "name_field"] = "prefix"
    #: The backend of the ``llm`` policy's moderator (default: the first responder seat's).
    moderator_backend: str | None = None
    #: Group dialogues per condition; default: as many as the personas fill without a persona
    #: taking two seats of one dialogue (personas ÷ client seats, at least one).
    dialogues: int | None = Field(None, ge=1)

    @field_validator("next_speaker")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in NEXT_SPEAKERS:
            raise ValueError(f"unknown next-speaker policy {v!r}; known: {NEXT_SPEAKERS.names()}")
        return v


class RunConfig(_Strict):
    """A whole run: personas × conversations × pairings × conditions (or, with
    ``participants:``, group dialogues × conditions)."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9._-]+$")
    #: Stored as a 64-bit integer (the personas' and dialogues' ``seed`` columns).
    seed: int = Field(0, ge=SEED_MIN, le=SEED_MAX)
    personas: PersonaConfig = PersonaConfig()
    conversations_per_persona: int = Field(1, ge=1)
    #: Trials (``--trials K``): every planned dialogue runs K times, each with its own seed
    #: derived from the dialogue's (``dialogues.trial``), so ``spasm eval`` can say how reliably
    #: a scenario succeeds (pass^k). 1: the run as without trials, byte for byte.
    trials: int = Field(1, ge=1, le=100)
    conditions: list[str] = ["ecp"]
    backends: dict[str, BackendConfig] = {"embedded": BackendConfig(kind="embedded")}
    pairings: list[PairingConfig] | Literal["grid"] = [
        PairingConfig(client="embedded", responder="embedded")
    ]
    dialogue: DialogueConfig = DialogueConfig()
    termination: TerminationConfig = TerminationConfig()
    engine: EngineConfig = EngineConfig()
    harness: HarnessConfig = HarnessConfig()
    #: Scenarios with goals (:mod:`spasm.scenarios`): a YAML, JSONL or CSV file (a relative
    #: path is read from the working directory) or an inline list of {id, situation, goal,
    #: expected_outcome, context}; crossed with the personas.
    scenarios: str | list[dict[str, Any]] | None = None
    #: The goal judge of a run with scenarios.
    scenarios_judge: GoalJudgeConfig = GoalJudgeConfig()
    #: Group dialogues: the seats, in turn order (replaces ``pairings`` for the run).
    participants: list[ParticipantConfig] | None = None
    group: GroupConfig = GroupConfig()
    #: The dataset's license for export cards (a Hub id such as ``cc-by-4.0``); not part of
    #: what determines the data, so changing it never blocks a resume.
    license: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9.+_-]+$")
    #: Agents that act (docs/tools.md): the modules that define tools (``.py`` files, importable
    #: modules, or names a plugin registers); scenarios give each dialogue its ``world``.
    tools: list[str] = []

    @model_validator(mode="after")
    def _check_tools(self) -> RunConfig:
        if not self.tools:
            return self
        if any(not t.strip() for t in self.tools) or len(set(self.tools)) != len(self.tools):
            raise ValueError("tools: each entry names a .py file, a module or a plugin's tool, "
                             "once")
        levels = {self.harness.client, self.harness.responder, *(self.harness.levels or []),
                  *(s.level for s in self.participants or ())}
        if levels != {"A"}:
            raise ValueError("tools run at harness level A (the plain agents); remove the harness "
                             "levels from this run with tools")
        return self

    @field_validator("conditions")
    @classmethod
    def _known_conditions(cls, v: list[str]) -> list[str]:
        projection_names = PROJECTIONS.names
        if not v:
            raise ValueError("at least one condition is needed")
        unknown = [c for c in v if c not in projection_names()]
        if unknown:
            raise ValueError(f"unknown condition(s) {unknown}; known: {projection_names()}")
        if len(set(v)) != len(v):
            raise ValueError("conditions repeat")
        return v

    @field_validator("backends")
    @classmethod
    def _backend_names(cls, v: dict[str, BackendConfig]) -> dict[str, BackendConfig]:
        # A pairing's label is "client/responder" and dialogue ids are viewer URLs: a name with
        # "/" would make two pairings one label, and "/", "..", control characters or an empty
        # name give ids the viewer cannot open.
        for name in v:
            bad = not name or ".." in name or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name)
            if bad:
                raise ValueError(
                    f"backend name {name!r} is not allowed: a name is non-empty and has no '/', "
                    "'\\', '..' or control characters (e.g. gpt-4o, local_qwen)"
                )
        return v

    @field_validator("pairings")
    @classmethod
    def _distinct_pairings(cls, v: list[PairingConfig] | str) -> list[PairingConfig] | str:
        if isinstance(v, list):
            seen: set[tuple[str, str]] = set()
            for p in v:
                if (p.client, p.responder) in seen:
                    raise ValueError(
                        f"pairing {p.label} is listed twice; each pairing already runs once for every "
                        "persona, conversation and condition (raise conversations_per_persona for "
                        "more dialogues). Remove the repeat."
                    )
                seen.add((p.client, p.responder))
        return v

    @model_validator(mode="after")
    def _check_references(self) -> RunConfig:
        if not self.backends:
            raise ValueError("at least one backend is needed")
        # A group run has no pairings: its seats name their backends (_check_group).
        if self.participants is None and not self.pairing_list:
            raise ValueError("pairings is empty: list at least one {client, responder} pairing, "
                             "or write pairings: grid")
        names = set(self.backends)
        pairings = self.pairing_list
        refs = [(p.client, "pairings") for p in pairings] + [
            (p.responder, "pairings") for p in pairings
        ]
        if self.personas.backend:
            refs.append((self.personas.backend, "personas.backend"))
        if self.termination.judge_backend:
            refs.append((self.termination.judge_backend, "termination.judge_backend"))
        if self.harness.backend:
            refs.append((self.harness.backend, "harness.backend"))
        if self.scenarios_judge.backend:
            refs.append((self.scenarios_judge.backend, "scenarios_judge.backend"))
        for ref, where in refs:
            if ref not in names:
                raise ValueError(f"{where} names backend {ref!r}, not one of {sorted(names)}")
        return self

    @model_validator(mode="after")
    def _check_judge_defaults(self) -> RunConfig:
        # A judge or a moderator left to its default asks a seat's backend; when that seat is
        # code (kind: python, the agent under test) it would receive the judge's prompt, with
        # the expected outcome, or the moderator's. Such a default is refused: name a model.
        python = {n for n, b in self.backends.items() if b.kind == "python"}
        roles = {s.role for s in self.participants or ()}
        if not python or (self.participants is not None and roles != {"client", "responder"}):
            return self  # (a group without a seat of each role: _check_group says so)
        # The judges' default is each dialogue's client backend (a group's first client seat's).
        clients = ([p.client for p in self.pairing_list] if self.participants is None
                   else [self.helper_backend])
        defaults: list[tuple[str, str | None, list[str], str]] = []
        if self.termination.judge:
            defaults.append(("termination.judge_backend", self.termination.judge_backend,
                             clients, "the termination judge"))
        if self.scenarios is not None and self.scenarios_judge.enabled:
            defaults.append(("scenarios_judge.backend", self.scenarios_judge.backend, clients,
                             "the goal judge (it is shown the expected outcome)"))
        if self.personas.llm_validate or self.personas.llm_craft:
            defaults.append(("personas.backend", self.personas.backend, clients[:1],
                             "the persona validator and crafter"))
        if self.participants is not None and self.group.next_speaker == "llm":
            helper = self.seat_backend("responder")
            defaults.append(("group.moderator_backend", self.group.moderator_backend, [helper],
                             "the next-speaker moderator"))
        models = sorted(set(self.backends) - python) or "an openai or embedded backend you add"
        for key, chosen, fallback, who in defaults:
            code = sorted({b for b in fallback if b in python})
            if chosen is None and code:
                raise ValueError(
                    f"{key} is not set, so {who} would ask backend {code[0]!r}, which is "
                    f"kind: python (code, not a model): set {key} to a model backend "
                    f"(one of {models})")
        return self

    @model_validator(mode="after")
    def _check_group(self) -> RunConfig:
        seats = self.participants
        if seats is None:
            return self
        where = "participants"
        if self.pairings != type(self).model_fields["pairings"].default:
            raise ValueError("participants replaces pairings in a group run: give one or the other")
        if len(seats) < 2:
            raise ValueError(f"{where}: a group dialogue needs at least two participants")
        roles = [s.role for s in seats]
        if "client" not in roles or "responder" not in roles:
            raise ValueError(f"{where}: at least one client seat and one responder seat are needed")
        ids = [s.id.lower() for s in seats]
        taken = sorted(s.id for s in seats if s.id.lower() in RESERVED_PARTICIPANT_IDS)
        if taken:
            raise ValueError(f"{where}: {taken} would read as a role or a chat label in transcripts "
                             "and in `spasm export --role`; give the participant a name")
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"{where}: ids repeat (ignoring case): {dup}")
        for s in seats:
            if s.backend not in self.backends:
                raise ValueError(f"{where}: {s.id} names backend {s.backend!r}, not one of "
                                 f"{sorted(self.backends)}")
        g = self.group
        if g.opener is not None and g.opener not in [s.id for s in seats]:
            raise ValueError(f"group.opener {g.opener!r} is not a participant id")
        if g.moderator_backend is not None and g.moderator_backend not in self.backends:
            raise ValueError(f"group.moderator_backend names backend {g.moderator_backend!r}, "
                             f"not one of {sorted(self.backends)}")
        h = self.harness
        if h.levels is not None or h.client != "A" or h.responder != "A":
            raise ValueError("a group run sets each seat's harness level as participants[].level; "
                             "remove harness.levels, harness.client and harness.responder")
        if h.recall_probe:
            raise ValueError("recall probes ask about one partner: they are for two-party "
                             "dialogues; remove harness.recall_probe from this group run")
        # scenarios: crossed with every group dialogue (runplan.plan_groups).
        return self

    @property
    def group_plan(self) -> tuple[int, int] | None:
        """``(group dialogues per condition, client seats)`` of a group run, else ``None``
        (for personas from a file without ``n`` the engine counts the rows)."""
        if self.participants is None:
            return None
        seats = sum(1 for s in self.participants if s.role == "client")
        n = self.group.dialogues or max(1, (self.personas.n or seats) // seats)
        return n, seats

    @model_validator(mode="after")
    def _check_plan_size(self) -> RunConfig:
        # Inline scenarios cross every persona (a persona's own scenario, from a data file,
        # runs 1:1: the engine counts those, and a scenario file, when it reads them).
        inline = isinstance(self.scenarios, list) and (
            self.personas.source is None or self.participants is not None)
        problem = self.plan_size_problem(len(self.scenarios or []) if inline else None)
        if problem is not None:
            raise ValueError(problem)
        return self

    def plan_factors(self, scenarios: int | None = None,
                     personas: int | None = None) -> tuple[list[int], str]:
        """The counts whose product is the plan's size, and their names: personas ×
        conversations × pairings × conditions × harness levels (a group run: group dialogues ×
        1 × 1 × conditions × 1), × trials (``trials`` > 1), × ``scenarios`` when given.
        ``personas``: their count when known (a data file's rows), else ``personas.n``."""
        levels = len(self.harness.levels) if self.harness.levels else 1
        # A source without n: its rows are counted when it is read (the engine checks again).
        factors = [personas or self.personas.n or 1, self.conversations_per_persona,
                   len(self.pairing_list), len(self.conditions), levels]
        names = "personas × conversations × pairings × conditions × harness levels"
        if self.group_plan is not None:
            groups, seats = self.group_plan
            if personas is not None and self.group.dialogues is None:
                groups = max(1, personas // seats)
            factors = [groups, 1, 1, len(self.conditions), 1]
        if self.trials > 1:
            factors.append(self.trials)
            names += " × trials"
        if scenarios is not None:
            factors.append(scenarios)
            names += " × scenarios"
        return factors, names

    def plan_size_problem(self, scenarios: int | None = None, personas: int | None = None,
                          where: str = "") -> str | None:
        """Why the plan is over ``engine.max_planned_dialogues`` (``None``: it is not):
        personas × conversations × pairings × conditions × harness levels (a group run: group
        dialogues × conditions), × ``scenarios`` when given. ``personas``: their count when
        known (a data file's rows), else ``personas.n``; ``where`` names the counts' source."""
        factors, names = self.plan_factors(scenarios, personas)
        planned = math.prod(factors)
        limit = self.engine.max_planned_dialogues
        if planned <= limit:
            return None
        return (
            f"the plan has {planned:,} dialogues{where} ({names} = "
            f"{' × '.join(f'{f:,}' for f in factors)}), over "
            f"engine.max_planned_dialogues = {limit:,}. Lower the counts, or raise "
            "engine.max_planned_dialogues in the config if you mean it (memory grows ~1 KB "
            "per planned dialogue)."
        )

    @property
    def pairing_list(self) -> list[PairingConfig]:
        """The two-party pairings, with ``grid`` expanded to every (client, responder)
        combination; empty in a group run (``participants``), which has seats, not pairings
        (its backends: :attr:`dialogue_backends`, :attr:`used_backends`)."""
        if self.participants is not None:
            return []
        if self.pairings == "grid":
            return [PairingConfig(client=c, responder=r) for c in self.backends for r in self.backends]
        return list(self.pairings)

    def seat_backend(self, role: Literal["client", "responder"]) -> str:
        """The backend of a group run's first seat of ``role`` (the seat the dialogues row's
        ``client_backend``/``responder_backend`` name); only for a group run."""
        assert self.participants is not None, "seat_backend is for a group run (participants)"
        return next(s.backend for s in self.participants if s.role == role)

    @property
    def dialogue_backends(self) -> list[str]:
        """The backends that speak in the run's dialogues, sorted: every pairing's client and
        responder, or every seat's in a group run."""
        if self.participants is not None:
            return sorted({s.backend for s in self.participants})
        return sorted({p.client for p in self.pairing_list} | {p.responder for p in self.pairing_list})

    @property
    def used_backends(self) -> list[str]:
        """Every backend the run calls, sorted: :attr:`dialogue_backends`, and those its helper
        calls name (``personas.backend``, ``termination.judge_backend``, ``harness.backend``,
        ``scenarios_judge.backend`` with scenarios, ``group.moderator_backend`` in a group
        run). A helper left to its default asks a dialogue backend, already in the set."""
        used = set(self.dialogue_backends)
        helpers = [self.personas.backend, self.termination.judge_backend, self.harness.backend,
                   self.scenarios_judge.backend if self.scenarios is not None else None,
                   self.group.moderator_backend if self.participants is not None else None]
        used.update(b for b in helpers if b)
        return sorted(used)

    @property
    def helper_backend(self) -> str:
        """The backend a helper LLM call outside any dialogue defaults to (the persona
        validator, crafter and extraction; the eval probe and judge): the first pairing's
        client, or a group run's first client seat's backend. (Inside a dialogue the
        termination and goal judges default to that dialogue's client backend.)"""
        if self.participants is not None:
            return self.seat_backend("client")
        return self.pairing_list[0].client

    def redacted(self) -> dict[str, Any]:
        """The resolved config as plain data; it holds env var names, never key values, and
        no credential of a ``base_url`` (:func:`spasm.redact.redact_url`)."""
        data = self.model_dump(mode="json")
        for backend in data["backends"].values():
            if backend.get("base_url"):
                backend["base_url"] = redact_url(backend["base_url"])
        return data

    def fingerprint(self) -> str:
        """A hash of what determines the dataset (used to refuse resuming a different run)."""
        data = self.redacted()
        for key in _NOT_CONTENT:
            data.pop(key, None)
        for b in data["backends"].values():
            for key in _BACKEND_NOT_CONTENT:
                b.pop(key, None)
        for where, switch, unset, keys in _ADDED_LATER:
            sections = data["backends"].values() if where == "backends.*" else [
                data if not where else data[where]]
            for section in sections:
                if section.get(switch) in unset:
                    for key in keys:
                        section.pop(key, None)
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


#: Settings that change speed, caps or the cache, not what a run holds: out of the
#: fingerprint, so a resume may change them.
_NOT_CONTENT: tuple[str, ...] = ("engine", "license")
#: The same for each backend (``structured_output`` is a transport detail: what is cached is
#: the request itself; whether code's replies may be replayed is a cache setting).
_BACKEND_NOT_CONTENT: tuple[str, ...] = (
    "max_concurrency", "rpm", "tpm", "timeout_s", "max_attempts", "n_threads",
    "structured_output", "deterministic",
)
#: Settings added after runs were first written: ``(section, switch, unset values, keys)``.
#: While the switch that turns the feature on is unset, its keys are left out of the
#: fingerprint, so the runs written before them keep theirs (and can be resumed). A new
#: setting adds one line here. ``backends.*``: in every backend.
_ADDED_LATER: tuple[tuple[str, str, tuple[Any, ...], tuple[str, ...]], ...] = (
    ("", "scenarios", (None,), ("scenarios", "scenarios_judge")),
    ("personas", "source", (None,), ("source", "field_map")),
    ("termination", "detectors", (None, []), ("detectors",)),
    ("backends.*", "target", (None,), ("target",)),
    ("", "participants", (None,), ("participants", "group")),
    ("harness", "persona_probes", (False,), ("persona_probes",)),
    ("", "trials", (1,), ("trials",)),
    ("backends.*", "operator", (None,), ("operator",)),
    ("backends.*", "interface", (None,), ("interface",)),
    ("personas", "ids", (None,), ("ids",)),
    ("", "tools", ([],), ("tools",)),
    ("dialogue", "max_tool_steps", (8,), ("max_tool_steps",)),
    ("backends.*", "tool_mode", ("auto",), ("tool_mode",)),
)

def data_path(kind: Literal["schemas", "configs"], name: str) -> Path:
    """Locate a bundled data file: the repository's folder, or the copy inside the wheel."""
    repo = Path(__file__).resolve().parent.parent / kind / name
    if repo.exists():
        return repo
    packaged = Path(str(files("spasm").joinpath("_data", kind, name)))
    if packaged.exists():
        return packaged
    raise ConfigError(f"Bundled file {kind}/{name} not found (is the installation complete?)")


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One readable line per problem, naming the file and the field path."""
    lines = [f"{source}: the config is not valid:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (typo?)"
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    """Validate plain data (from YAML/JSON) into a :class:`RunConfig`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a run config must be a mapping of keys to values")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


#: No config or persona schema is anywhere near this size; a bigger file is a wrong path.
MAX_FILE_BYTES = 8 * 1024 * 1024


def read_user_text(path: str | Path, what: str, *, kinds: str = "a YAML file") -> str:
    """A user's text file (a config, a schema, scenarios), read with every way it can be
    unreadable a ConfigError naming the file (and the line of a byte that is not UTF-8),
    never a traceback; at most :data:`MAX_FILE_BYTES`; a UTF-8 byte-order mark is dropped."""
    p = Path(path)
    try:
        if p.is_dir():
            raise ConfigError(f"{what} {p} is a directory; name {kinds}.")
        with p.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"Cannot read {what} {p}: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{what} {p} is over {MAX_FILE_BYTES // (1024 * 1024)} MiB; is this the "
                          "right file?")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{p}, line {line}: not UTF-8 text (byte {exc.start}); save the {what} "
                          "as UTF-8.") from None


def read_yaml(path: str | Path, what: str) -> Any:
    """Read a user's YAML (or JSON) file: every way it can be unreadable is a ConfigError
    naming the file, never a traceback."""
    p = Path(path)
    text = read_user_text(p, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. a date like 0000-00-00
        raise ConfigError(f"{p}: a value cannot be read ({type(exc).__name__}: {exc})") from None


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML or JSON run config."""
    return parse_config(read_yaml(path, "config"), str(path))


def config_differences(old: Any, new: Any, prefix: str = "", limit: int = 6) -> str:
    """The dotted config fields that differ between two resolved configs, for messages."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            out.append(f"{path or 'config'}: {json.dumps(a, default=str)[:40]} → "
                       f"{json.dumps(b, default=str)[:40]}")

    walk(old, new, prefix)
    if not out:
        return "the config format changed"
    more = f" and {len(out) - limit} more" if len(out) > limit else ""
    return "; ".join(out[:limit]) + more
