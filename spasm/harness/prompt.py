"""Layer 5, the orchestrated prompt (docs/harness.md, "The layers"; tests/snapshots pin it).

The prompt order (docs/harness.md, "Prompt"): core identity facts, the 3–5 most relevant
state items, scene, style rules, the top never-boundaries, examples, last correction. Prompt
caching wants the stable parts first, so the prompt is cut into two blocks and that order is
kept *within* each:

* the **stable block** — the system message: the role frame, identity facts, style rules, the
  top never-boundaries (and the always-rules). It is byte-identical at every turn of a
  dialogue, so a provider's prefix cache hits on it;
* the **context** — the structured record of older turns, as a second system message; it
  changes only every ``stride`` utterances;
* the verbatim window, framed by the run's projection (ECP or CONCAT decides, as at level A);
* the **turn block** — a final system message: state items, scene (intent, partner emotion,
  unresolved questions), examples, the last correction. It changes every turn and comes last,
  after everything a cache can reuse.

The whole state is never dumped: :func:`spasm.harness.state.salient_items` picks 3–5 items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from spasm.backends.base import Message
from spasm.harness.policy import CharacterPolicy
from spasm.history import History, Utterance
from spasm.projection import Viewer, project

__all__ = [
    "CONTINUED_OPENING",
    "TurnBlock",
    "orchestrate",
    "stable_prompt",
    "turn_block",
]

#: The first user message of a window that starts with the viewer's own turn (ECP needs one).
CONTINUED_OPENING = "(The conversation continues; earlier messages are summarised above.)"


def _bullets(title: str, items: Sequence[str]) -> str:
    return title + "\n" + "\n".join(f"- {x}" for x in items)


def stable_prompt(base: str, policy: CharacterPolicy | None, *, never_n: int = 5) -> str:
    """The stable block: the role frame, then the policy in prompt order (facts, style, never)."""
    if policy is None:
        return base
    parts = [base]
    who = [*policy.facts]
    if policy.values:
        who.append("You value: " + "; ".join(v.rstrip(".") for v in policy.values[:3]) + ".")
    who += policy.decision_policies[:3]
    if who:
        parts.append(_bullets("Who you are:", who))
    style = [*policy.style_rules, *policy.speech_patterns[:3]]
    if style:
        parts.append(_bullets("How you write:", style))
    if policy.boundaries.never:
        parts.append(_bullets("Never:", policy.boundaries.never[:never_n]))
    if policy.boundaries.always:
        parts.append(_bullets("Always:", policy.boundaries.always))
    return "\n\n".join(parts)


@dataclass(frozen=True)
class TurnBlock:
    """The parts of the prompt that change every turn (all optional)."""

    state_items: tuple[str, ...] = ()
    scene: tuple[str, ...] = ()
    examples: str | None = None
    correction: str | None = None
    rewrite: str | None = None


def turn_block(block: TurnBlock) -> str | None:
    """The final system message, in prompt order: state, scene, examples, correction."""
    parts: list[str] = []
    if block.state_items:
        parts.append(_bullets("Where you stand now:", block.state_items))
    if block.scene:
        parts.append(_bullets("Scene:", block.scene))
    if block.examples:
        parts.append(block.examples)
    if block.correction:
        parts.append(f"Last correction: {block.correction}")
    if block.rewrite:
        parts.append(block.rewrite)
    if not parts:
        return None
    return "Private notes for your next message (never mention them):\n\n" + "\n\n".join(parts)


def orchestrate(
    window: Sequence[Utterance],
    viewer: Viewer,
    condition: str,
    *,
    covered: int,
    context: str | None,
    block: str | None,
) -> list[Message]:
    """The messages an agent sees at a harnessed turn.

    ``window`` is the verbatim tail of the history and ``covered`` how many utterances precede
    it (summarised in ``context``). The projection named ``condition`` frames the window exactly
    as it frames a whole history at level A.
    """
    if covered:
        viewer = replace(viewer, opening=CONTINUED_OPENING)
    messages = project(History(tuple(window)), viewer, condition)
    if context:
        messages.insert(1, {"role": "system", "content": context})
    if block:
        messages.append({"role": "system", "content": block})
    return messages
