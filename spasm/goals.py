"""The goal judge of a run with scenarios (issue 18 item 2).

One structured call through the one caller (:meth:`spasm.calls.Caller.structured`, role
``goal_judge``): the judge reads the transcript, the Client's goal and the expected outcome
(which neither agent ever sees) and answers ``{"goal_met": true|false, "reason": "..."}``.
The run layer (:func:`spasm.runner.run_dialogue`) asks it once after the dialogue; with
``scenarios_judge.termination`` a :class:`GoalDetector` in the termination chain also asks it
after each exchange and ends the dialogue once the goal is reached (reason ``goal_reached``).
A judge that never answers in the schema decides nothing (``goal_met`` stays null).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from spasm.backends.base import Message
from spasm.calls import Caller, CallScope
from spasm.history import History
from spasm.projection import transcript
from spasm.termination import Stop

__all__ = ["GOAL_REACHED", "GoalDetector", "GoalVerdict", "goal_messages", "judge_goal"]

#: The termination reason when the goal detector ends a dialogue.
GOAL_REACHED = "goal_reached"


class GoalVerdict(BaseModel):
    """The goal judge's structured verdict."""

    model_config = ConfigDict(extra="ignore")

    goal_met: bool
    reason: str


def goal_messages(history: History, goal: str, expected_outcome: str) -> list[Message]:
    """What the goal judge is sent: its instructions, then the goal, the expected outcome and
    the transcript."""
    return [
        {
            "role": "system",
            "content": "You read a conversation between a Client and a Responder and decide "
            "whether the Client's goal was met: the expected outcome happened in the "
            "conversation (a promise of it counts only when the Responder commits to it). "
            'Answer with a JSON object {"goal_met": true|false, "reason": "one sentence"}.',
        },
        {
            "role": "user",
            "content": f"The Client's goal: {goal}\nThe expected outcome: {expected_outcome}\n\n"
            f"The conversation:\n{transcript(history)}",
        },
    ]


async def judge_goal(
    caller: Caller, backend: str, history: History, goal: str, expected_outcome: str,
    scope: CallScope, *, temperature: float = 0.0, max_tokens: int = 160, seed: int | None = None,
) -> GoalVerdict | None:
    """Ask the goal judge about ``history``; ``None`` when it gave no usable answer."""
    result = await caller.structured(
        "goal_judge", backend, goal_messages(history, goal, expected_outcome), GoalVerdict, scope,
        temperature=temperature, max_tokens=max_tokens, seed=seed,
    )
    return result.value


class GoalDetector:
    """A termination detector: the dialogue ends once the goal judge says the goal is met."""

    name = "goal"

    def __init__(self, caller: Caller, backend: str, goal: str, expected_outcome: str, *,
                 temperature: float = 0.0, max_tokens: int = 160, seed: int = 0) -> None:
        self.caller = caller
        self.backend = backend
        self.goal = goal
        self.expected_outcome = expected_outcome
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        #: The verdict that ended the dialogue (the run layer reuses it instead of asking again).
        self.reached: GoalVerdict | None = None

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        verdict = await judge_goal(
            self.caller, self.backend, history, self.goal, self.expected_outcome, scope,
            temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed + len(history),
        )
        if verdict is not None and verdict.goal_met:
            self.reached = verdict
            return Stop(GOAL_REACHED, verdict.reason)
        return None
