"""The terminal as a person's seat: what the seat sees, rendered readably; one typed line a turn.

The person is shown exactly what the seat's model would be sent (the request's messages), as
text: the frame once (a client seat's persona card with the situation and goal), then what is
new in the seat's view before each of their turns (under ``concat`` and ``quoted`` the view is
one transcript that changes as a whole, so it is shown again whole). They type one line:
``/end`` ends the dialogue, Ctrl-D (end of input) or Ctrl-C ends it too and keeps what was said
(``ended_by_person``); ``/help`` says so. A Ctrl-C while the other side is answering ends the
dialogue at the person's next turn (a second one stops at once, as anywhere).

A person who sends nothing is waited for as long as they take (nothing is held open that
matters: the dialogue simply resumes with their next line), unless ``idle_timeout_s`` is set
(``spasm play --idle-timeout 30m``): when that long passes after a prompt without a line, the
dialogue ends there and keeps what was said (``termination_reason`` ``person_silent``, saved
like an ``/end``). The wait is timed with ``SIGALRM`` in the main thread, so it interrupts a
``readline`` prompt and a read from a pipe alike; elsewhere no timer is set.

Only the standard library: ``readline`` for line editing when stdin is a terminal; a plain
pipe on stdin works the same (one line a turn), so a session can be scripted. A terminal
measures only the time from the prompt to the line (``typing_ms``); ``edits`` and
``pasted_chars`` stay unmeasured (``None``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, TextIO

from spasm.backends.base import ChatRequest, Message
from spasm.backends.human import PersonReply
from spasm.errors import ParticipantLeft

__all__ = ["SILENT", "TerminalPerson", "duration_text"]

HELP = ("Type your message and press Enter. /end ends the conversation (so do Ctrl-D and "
        "Ctrl-C); what was said is kept.")
#: ``termination_reason`` of a dialogue that ended because no line came within the idle timeout.
SILENT = "person_silent"


class _Silent(Exception):
    """Raised by the idle timer's SIGALRM handler into the blocked read."""

#: Who a two-party seat's partner is, by the seat, and how a two-party speaker is labelled.
_PARTNER = {"client": "Responder", "responder": "Client"}
_LABEL = {"client": "Client", "responder": "Responder"}


class TerminalPerson:
    """A person at a terminal (or a script on a pipe) answering for one seat."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 width: int | None = None, idle_timeout_s: float | None = None) -> None:
        if idle_timeout_s is not None and not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be positive, not {idle_timeout_s!r}")
        #: Seconds a prompt waits for a line before the dialogue ends (``None``: no limit).
        self.idle_timeout_s = idle_timeout_s
        self.stdin = stdin if stdin is not None else sys.stdin
        self.out = stdout if stdout is not None else sys.stdout
        self.width = width or min(100, shutil.get_terminal_size((88, 24)).columns)
        self._shown: dict[str, list[Message]] = {}
        self._typed: list[str] = []
        #: How many utterances of the dialogue the person has seen (theirs included).
        self._seen = 0
        self._reading = False
        #: How many times the SIGINT handler ran (the relay's sign that a Ctrl-C arrived).
        self._sigints = 0
        #: Set by a Ctrl-C between turns: the dialogue ends at the next turn.
        self._left: str | None = None
        self.ended_by_person = False
        if self.stdin.isatty():
            with contextlib.suppress(ImportError):
                import readline  # noqa: F401  (line editing and history for input())

    # -- output -----------------------------------------------------------------------------
    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _block(self, label: str, text: str, indent: str = "  ") -> None:
        self.say(f"{label}:")
        for para in text.split("\n"):
            self.say(textwrap.fill(para, self.width, initial_indent=indent,
                                   subsequent_indent=indent) if para.strip() else "")

    def _render(self, messages: Sequence[Message], speaker: str, opening: bool,
                whole: bool = False) -> None:
        partner = _PARTNER.get(speaker, "")
        for m in messages:
            if m["role"] == "system":
                self.say("=" * min(self.width, 60))
                self._block("Your part (what the seat's model would be told)", m["content"])
                self.say("=" * min(self.width, 60))
                self.say(HELP)
            elif m["role"] == "assistant":
                if self._typed and m["content"] == self._typed[-1]:
                    continue  # the person's own last line, already on screen
                self._block("You", m["content"])
            elif opening:
                self._block("(how the seat is asked to begin)", m["content"])
            elif whole:  # concat / quoted: one message that holds the transcript
                self._block("(what your seat is sent)", m["content"])
            else:
                who = m.get("name") or partner or "Them"
                self._block(who, m["content"])

    # -- the Person protocol -----------------------------------------------------------------
    async def reply(self, request: ChatRequest, backend: str) -> PersonReply:
        if self._left is not None:
            raise ParticipantLeft(self._left)
        ctx = request.context
        speaker = (ctx.speaker if ctx is not None else None) or "client"
        messages = list(request.messages)
        key = request.stream_key or speaker
        before = self._shown.get(key)
        opening = ctx is not None and ctx.turn_index == 0
        if before is not None and messages[: len(before)] == before:
            self._render(messages[len(before):], speaker, opening)
        elif before is not None:  # concat / quoted: the view is one transcript, shown again
            self.say("-- the conversation as your seat sees it now --")
            self._render([m for m in messages if m["role"] != "system"], speaker, opening,
                         whole=True)
        else:
            self._render(messages, speaker, opening)
        self._shown[key] = messages
        self._seen = ctx.turn_index if ctx is not None and ctx.turn_index is not None else self._seen
        reply = self._read()
        self._seen += 1
        self._typed.append(reply.text)
        self._shown[key] = [*messages, {"role": "assistant", "content": reply.text}]
        self.say(f"({_PARTNER.get(speaker, 'the others').lower()} is typing...)"
                 if speaker in _PARTNER else "(the others are typing...)")
        return reply

    async def debrief(self, dialogue_id: str, goal: str | None,
                      transcript: Sequence[tuple[str, str]], reason: str) -> dict[str, Any]:
        # What was said after the person last saw the conversation (the reply it ended on).
        for speaker, text in transcript[self._seen:]:
            self._block(_LABEL.get(speaker, speaker), text)
        self.say(f"-- the conversation has ended ({reason}) --")
        if self.ended_by_person and self._left is not None and (
                "Ctrl" in self._left or "--idle-timeout" in self._left):
            return {}  # the input is closed, interrupted or silent: nothing more to ask
        out: dict[str, Any] = {}
        with contextlib.suppress(ParticipantLeft):
            if goal:
                self._block("Your goal was", goal)
                answer = self._ask("Was it met? [y/n, Enter to skip] ", {"y", "yes", "n", "no"})
                if answer is not None:
                    out["person_goal_met"] = answer.startswith("y")
            rating = self._ask("How would you rate your partner, 1 (poor) to 5 (excellent)? "
                               "[Enter to skip] ", {"1", "2", "3", "4", "5"})
            if rating is not None:
                out["person_rating"] = int(rating)
        return out

    # -- input ------------------------------------------------------------------------------
    def _line(self, prompt: str) -> str:
        """One line from the person; EOFError at the end of input, KeyboardInterrupt on Ctrl-C."""
        self._reading = True
        try:
            if self.stdin is sys.stdin and self.stdin.isatty() and self.out is sys.stdout:
                return input(prompt)
            self.out.write(prompt)
            self.out.flush()
            line = self.stdin.readline()
            if not line:
                raise EOFError
            line = line.rstrip("\r\n")
            if not self.stdin.isatty():  # a script: echo it, so the session reads as typed
                self.out.write(line[:200] + ("..." if len(line) > 200 else "") + "\n")
            return line
        finally:
            self._reading = False

    def _leave(self, detail: str) -> ParticipantLeft:
        self.ended_by_person = True
        self._left = detail
        self.say()
        return ParticipantLeft(detail)

    @contextlib.contextmanager
    def _idle_timer(self) -> Iterator[None]:
        """While a prompt waits for a line: :class:`_Silent` once ``idle_timeout_s`` has passed
        (main thread only; without a timeout, or elsewhere, nothing is set)."""
        if self.idle_timeout_s is None or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_alarm(signum: int, frame: FrameType | None) -> None:
            if self._reading:  # a line that arrived just now is kept, not lost to the timer
                raise _Silent

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.idle_timeout_s)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _read(self) -> PersonReply:
        t0 = time.monotonic()
        while True:
            try:
                with self._idle_timer():
                    line = self._line("you> ")
            except _Silent:
                wait = duration_text(self.idle_timeout_s or 0)
                self._left = f"no line from the person for {wait} (--idle-timeout)"
                self.ended_by_person = True
                self.say()
                self.say(f"(nothing typed for {wait}: the conversation ends here; what was said "
                         "is kept)")
                raise ParticipantLeft(self._left, reason=SILENT) from None
            except EOFError:
                raise self._leave("the person closed the input (Ctrl-D)") from None
            except KeyboardInterrupt:
                raise self._leave("the person interrupted (Ctrl-C)") from None
            text = line.strip()
            if text == "/end":
                self.ended_by_person = True
                self._left = "the person typed /end"
                raise ParticipantLeft(self._left)
            if text == "/help":
                self.say(HELP)
                continue
            if not text:
                self.say("(type a message, or /end to finish)")
                continue
            return PersonReply(text=text, typing_ms=round((time.monotonic() - t0) * 1000))

    def _ask(self, prompt: str, accepted: set[str]) -> str | None:
        """A short answer from ``accepted`` (lower-cased), ``None`` when skipped or ended."""
        while True:
            try:
                with self._idle_timer():
                    answer = self._line(prompt).strip().lower()
            except (EOFError, KeyboardInterrupt, _Silent):
                raise ParticipantLeft("the person closed the input or stayed silent") from None
            if not answer:
                return None
            if answer in accepted:
                return answer
            self.say(f"(one of {', '.join(sorted(accepted))}, or Enter to skip)")

    # -- Ctrl-C -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """Ctrl-C as the person's way out for the session: while they type it ends their turn
        (and the dialogue, kept); while the other side answers it ends the dialogue at their
        next turn; a second one then stops at once."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigint(signum: int, frame: FrameType | None) -> None:
            self._sigints += 1
            if self._reading or self._left is not None:
                raise KeyboardInterrupt
            self._left = "the person interrupted (Ctrl-C)"
            self.ended_by_person = True
            self.out.write("\n(the conversation ends at your next turn; Ctrl-C again stops at "
                           "once)\n")
            self.out.flush()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            with _SigintRelay(self):
                yield
        finally:
            signal.signal(signal.SIGINT, previous)


class _SigintRelay:
    """Makes a Ctrl-C typed at the prompt end the read, however it lands.

    CPython runs a signal's Python handler only when the main thread next runs bytecode, and
    a read of the prompt wakes for it only if the signal interrupts that read. A SIGINT that
    lands while the main thread is in C code on its way into the read (readline between
    drawing the prompt and its ``select()``), or that the kernel hands to another thread,
    marks the handler as due and wakes nothing: the prompt would wait on. The relay watches the
    wakeup fd (written by the C handler in whichever thread it ran) and, while a prompt is open
    and the handler has not run, sends the main thread :data:`WAKE`, whose empty handler
    interrupts the read so that the due SIGINT handler runs. SIGURG is ignored by default, so
    one that arrives after the session is harmless.
    """

    WAKE = signal.SIGURG
    #: How long after a Ctrl-C the relay keeps waking a prompt whose handler has not run.
    PATIENCE_S = 5.0

    def __init__(self, person: TerminalPerson) -> None:
        self._person = person
        self._stop = threading.Event()

    def __enter__(self) -> _SigintRelay:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._wake_previous = signal.signal(self.WAKE, lambda signum, frame: None)
        self._fd_previous = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._main = threading.get_ident()  # __enter__ runs on the main thread
        self._thread = threading.Thread(target=self._watch, name="spasm-sigint-relay", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._fd_previous)
        self._stop.set()
        os.write(self._w, b"\0")  # the watcher's read returns and it sees the stop
        self._thread.join(5)
        signal.signal(self.WAKE, self._wake_previous)
        os.close(self._r)
        os.close(self._w)

    def _watch(self) -> None:
        person = self._person
        while not self._stop.is_set():
            numbers = os.read(self._r, 512)
            if self._stop.is_set() or signal.SIGINT not in numbers:
                continue
            handled = person._sigints
            deadline = time.monotonic() + self.PATIENCE_S
            while (person._reading and person._sigints == handled and not self._stop.is_set()
                   and time.monotonic() < deadline):
                signal.pthread_kill(self._main, self.WAKE)
                time.sleep(0.05)


def duration_text(seconds: float) -> str:
    """``90`` → ``1 min 30 s``; ``2`` → ``2 s``; ``3600`` → ``60 min``."""
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{seconds:g} s"
    return f"{minutes} min" + (f" {rest} s" if rest else "")
