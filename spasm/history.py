"""The perspective-agnostic dialogue history (SPEC §3).

The history is stored once, with absolute speakers. It is immutable: appending returns a new
history, so a projection computed from it can never change under an agent's feet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

#: Who spoke: a participant's id. In a two-party dialogue the ids are the roles themselves,
#: ``client`` and ``responder``; in a group dialogue they are the participants' short names.
Speaker = str
#: The two sides a participant can take.
Role = Literal["client", "responder"]

@dataclass(frozen=True, slots=True)
class Utterance:
    """One utterance ``u_k = (s_k, c_k)``: an absolute speaker and its content."""

    speaker: Speaker
    content: str


@dataclass(frozen=True, slots=True)
class History:
    """``H_t = (u_1 … u_t)``; immutable, appended to and never rewritten."""

    utterances: tuple[Utterance, ...] = ()

    def append(self, speaker: Speaker, content: str) -> History:
        """Return a new history with one more utterance."""
        return History((*self.utterances, Utterance(speaker, content)))

    def __len__(self) -> int:
        return len(self.utterances)

    def __iter__(self) -> Iterator[Utterance]:
        return iter(self.utterances)

    def __getitem__(self, index: int) -> Utterance:
        return self.utterances[index]

    def last(self, m: int) -> tuple[Utterance, ...]:
        """The last ``m`` utterances (fewer if the history is shorter)."""
        return self.utterances[-m:] if m > 0 else ()
