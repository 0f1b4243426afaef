"""The goal judge of a run with scenarios (README, "Scenarios with goals").

One structured call through the one caller (:meth:`spasm.calls.Caller.structured`, role
``goal_judge``): the judge reads the transcript, the Client's goal and the expected outcome
(which neither agent ever sees) and answers ``{"goal_met": true|false, "reason": "..."}``.
The run layer (:func:`spasm.runner.run_dialogue`) asks it once after the dialogue; with
``scenarios_judge.termination`` a :class:`GoalDetector` in the termination chain also asks it
after each exchange and ends the dialogue once the goal is reached (reason ``goal_reached``).
A judge that never answers in the schema decides nothing (``goal_met`` stays null).

In a group dialogue (:func:`spasm.runner.run_group`) the judge reads the whole group
transcript, each line labelled with its speaker's participant id, and is told which seats came
for help (they share the scenario's goal) and which help (:func:`group_goal_messages`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from spasm.backends.base import Message
from spasm.calls import Caller, CallScope
from spasm.history import History
from spasm.projection import name_list, transcript
from spasm.termination import Stop

__all__ = [
    "GOAL_REACHED", "GoalDetector", "GoalVerdict", "goal_messages", "group_goal_messages",
    "judge_goal",
]

#: The termination reason when the goal detector ends a dialogue.
GOAL_REACHED = "goal_reached"


class GoalVerdict(BaseModel):
    """The goal judge's structured verdict."""

    model_config = ConfigDict(extra="ignore")

    goal_met: bool
    reason: str


#: A group dialogue's seats for the judge: ``(participant id, role)`` in turn order.
Seats = Sequence[tuple[str, str]]


def group_goal_messages(history: History, goal: str, expected_outcome: str,
                        seats: Seats) -> list[Message]:
    """The goal judge's messages for a group dialogue: who came for help (the client seats,
    which share the scenario's goal) and who helps, then the goal, the expected outcome and
    the transcript with each line labelled with its speaker's participant id."""
    clients = [pid for pid, role in seats if role == "client"]
    helpers = [pid for pid, role in seats if role != "client"]
    lines = "\n".join(f"{u.speaker}: {u.content}" for u in history)
    return [
        {
            "role": "system",
            "content": f"You read a group conversation between {name_list([p for p, _ in seats])}. "
            f"{name_list(clients)} came for help and share one goal; {name_list(helpers)} "
            f"{'is' if len(helpers) == 1 else 'are'} there to help. Decide whether the goal "
            "was met: the expected outcome happened in the conversation (a promise of it counts "
            f"only when {' or '.join(helpers)} commits to it). Answer with a JSON object "
            '{"goal_met": true|false, "reason": "one sentence"}.',
        },
        {
            "role": "user",
            "content": f"The goal of {name_list(clients)}: {goal}\nThe expected outcome: "
            f"{expected_outcome}\n\nThe conversation (each line begins with the speaker's "
            f"id):\n{lines}",
        },
    ]


def goal_messages(history: History, goal: str, expected_outcome: str,
                  seats: Seats | None = None) -> list[Message]:
    """What the goal judge is sent: its instructions, then the goal, the expected outcome and
    the transcript (a group dialogue's, with ``seats``: :func:`group_goal_messages`)."""
    if seats is not None:
        return group_goal_messages(history, goal, expected_outcome, seats)
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
    seats: Seats | None = None,
) -> GoalVerdict | None:
    """Ask the goal judge about ``history`` (a group dialogue's with ``seats``); ``None`` when
    it gave no usable answer."""
    result = await caller.structured(
        "goal_judge", backend, goal_messages(history, goal, expected_outcome, seats), GoalVerdict,
        scope, temperature=temperature, max_tokens=max_tokens, seed=seed,
    )
    return result.value


class GoalDetector:
    """A termination detector: the dialogue ends once the goal judge says the goal is met."""

    name = "goal"

    def __init__(self, caller: Caller, backend: str, goal: str, expected_outcome: str, *,
                 temperature: float = 0.0, max_tokens: int = 160, seed: int = 0,
                 seats: Seats | None = None) -> None:
        self.caller = caller
        #: A group dialogue's seats (``None``: a Client and a Responder).
        self.seats = seats
        self._helpers = {pid for pid, role in seats or () if role != "client"}
        self.backend = backend
        self.goal = goal
        self.expected_outcome = expected_outcome
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        #: The verdict that ended the dialogue (the run layer reuses it instead of asking again).
        self.reached: GoalVerdict | None = None

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        if self.seats is not None and len(history) and history[-1].speaker not in self._helpers:
            # A group's chain checks after every utterance; the outcome needs a helper's turn
            # (as a two-party chain checks after each Responder turn): asked after those only.
            return None
        verdict = await judge_goal(
            self.caller, self.backend, history, self.goal, self.expected_outcome, scope,
            temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed + len(history),
            seats=self.seats,
        )
        if verdict is not None and verdict.goal_met:
            self.reached = verdict
            return Stop(GOAL_REACHED, verdict.reason)
        return None
