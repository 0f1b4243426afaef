"""The rule detector on crafted histories; the chain's minimum length."""

from __future__ import annotations

import anyio

from spasm.calls import CallScope
from spasm.history import History
from spasm.termination import RuleDetector, TerminationChain, near_duplicate


def _h(*texts: str) -> History:
    h = History()
    for i, t in enumerate(texts):
        h = h.append("client" if i % 2 == 0 else "responder", t)
    return h


def _check(h: History, min_utterances: int = 4):  # type: ignore[no-untyped-def]
    chain = TerminationChain([RuleDetector(4)], min_utterances)
    return anyio.run(chain.check, h, CallScope())


def test_client_goodbye_ends() -> None:
    stop = _check(_h("My washer broke.", "When did you buy it?", "Last year.",
                     "Then it is covered.", "Great, thanks so much. Goodbye!", "Take care!"))
    assert stop is not None and stop.reason == "natural_rule" and "closing" in stop.detail


def test_responder_alone_saying_have_a_nice_day_does_not_end() -> None:
    h = _h("My washer broke.", "Sorry! When did you buy it?", "Last year, in May.",
           "Then it is covered. Have a nice day!")
    assert _check(h) is None


def test_end_marker_and_repetition_loop() -> None:
    stop = _check(_h("a b c d", "e f g h", "i j k l <END>", "m n o p"))
    assert stop is not None and "end marker" in stop.detail
    loop = _h("I need help with my washer now", "Could you describe the problem please",
              "I need help with my washer now", "Could you describe the problem please")
    stop = _check(loop)
    assert stop is not None and "repetition" in stop.detail


def test_nothing_fires_before_the_minimum() -> None:
    assert _check(_h("Goodbye!", "Bye!"), min_utterances=4) is None
    assert _check(_h("Hi", "Hello", "Goodbye!", "Bye!"), min_utterances=6) is None


def test_near_duplicate() -> None:
    assert near_duplicate("Hello, how are you?", "hello how are you")
    assert not near_duplicate("My washer broke yesterday", "The warranty covers two years")
