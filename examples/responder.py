"""An example Responder: a small rule-based customer-support bot, as your own agent under test.

spasm calls it once per Responder turn (``kind: python`` in the config)::

    backends:
      bot: {kind: python, target: "examples/responder.py:respond", deterministic: true}

``messages`` is exactly what a model in the Responder's place would be sent: its system prompt
first, then the Client's messages as ``user`` and its own earlier replies as ``assistant``
(under the ``ecp`` condition). ``context`` says which dialogue, speaker and turn it is. The bot
answers from the Client's last message alone, so its replies depend on the messages only:
``deterministic: true`` lets a rerun replay them from the cache.

Replace the rules with a call into your own agent (a LangChain chain, a RAG pipeline, an HTTP
client for your service): return its reply text, or a dict with ``text``, ``prompt_tokens`` and
``completion_tokens`` to have its token usage logged in the ``calls`` table.
"""

from __future__ import annotations

import re
from typing import Any

#: (pattern in the customer's message, the reply), first match wins.
RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(thank|thanks|bye|goodbye)\b", re.I),
     "You're welcome! I'm glad I could help. Have a good day, goodbye."),
    (re.compile(r"\b(refund|money back|reimburse)", re.I),
     "I'm sorry about that. I can start a refund for you: could you give me the order number? "
     "Refunds reach your account within five working days."),
    (re.compile(r"\b(deliver|shipping|parcel|package|arriv|track)", re.I),
     "Let me check on your delivery. Could you share your order number? Most parcels arrive "
     "within three days of dispatch, and I can send you the tracking link."),
    (re.compile(r"\b(password|log ?in|sign ?in|account|locked)", re.I),
     "I can help you get back into your account. I'll send a reset link to the email address "
     "on file; could you confirm which address you registered with?"),
    (re.compile(r"\b(cancel|unsubscribe|stop)", re.I),
     "I can cancel that for you. Could you tell me what you'd like cancelled, and whether "
     "anything about it didn't work for you?"),
    (re.compile(r"\b(bill|charge|invoice|paid|payment|price)", re.I),
     "I understand a charge like that is worrying. Could you tell me the date and amount? "
     "I'll look it up and explain or correct it."),
    (re.compile(r"\b\d{4,}\b"),
     "Thank you, I've found it. I've taken care of it on our side; is there anything else I "
     "can help you with?"),
]

GREETING = "Hello, thanks for getting in touch. How can I help you today?"
FALLBACK = ("I see. Could you tell me a little more about what happened, so I can find the "
            "right way to help?")


def respond(messages: list[dict[str, str]], context: Any) -> str:
    """The bot's next reply to the conversation in ``messages``."""
    said = [m["content"] for m in messages if m["role"] == "user"]
    if not said:
        return GREETING
    last = said[-1]
    for pattern, reply in RULES:
        if pattern.search(last):
            return reply
    return FALLBACK
