"""The message of an exported example: a chat message as the agent saw it, and on the trained
role's own (assistant) messages whether to train on it."""

from __future__ import annotations

from spasm.backends.base import Message

__all__ = ["ExampleMessage"]


class ExampleMessage(Message, total=False):
    """One message of an :class:`~spasm.export.formats.Example`: a
    :class:`~spasm.backends.base.Message` (role, content, and ``name``, ``tool_calls`` or
    ``tool_call_id`` where the agent's frame had them), plus ``weight`` on the role's own
    assistant messages (1: train on it; 0: a turn the harness flagged or one with a kept,
    unredactable finding)."""

    weight: int
