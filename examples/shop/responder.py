"""A Responder that acts: a rule-based shop agent that uses its tools (docs/tools.md).

spasm calls it once per tool step (``kind: python``)::

    backends:
      agent: {kind: python, target: "examples/shop/responder.py:respond"}

``context.tools`` lists the tools it may call in this step (OpenAI ``tools`` items). It returns
``{"tool_calls": [{"name", "arguments"}]}`` to act: the calls run on the dialogue's world, and
it is called again with its calls as an ``assistant`` message and their results as ``tool``
messages after it. It returns text to speak. What the customer sees of its actions is the
tools' business: ``find_order`` and ``cancel_order`` show a notice, ``refund`` is seen by all.

It reads its results from the ``tool`` messages, which only ECP gives (examples/shop/config.yaml
runs ``ecp``): under ``quoted`` and ``concat`` an agent's own calls and results are lines of
the transcript, and this bot would look the order up until ``dialogue.max_tool_steps``, which
the run counts and says (``reward_detail.turns_at_step_cap``).
"""

from __future__ import annotations

import json
import re
from typing import Any

ORDER = re.compile(r"\b(\d{4})\b")


def _last_user(messages: list[dict[str, Any]]) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


def _this_turn(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The calls this turn made so far, in order: (tool name, its result or {"error": …})."""
    start = len(messages)
    while start > 0 and (messages[start - 1]["role"] == "tool"
                         or messages[start - 1].get("tool_calls")):
        start -= 1
    names: dict[str, str] = {}
    done = []
    for m in messages[start:]:
        for c in m.get("tool_calls") or []:
            names[c["id"]] = c["function"]["name"]
        if m["role"] == "tool":
            done.append((names.get(m["tool_call_id"], ""), json.loads(m["content"])))
    return done


def respond(messages: list[dict[str, Any]], context: Any) -> Any:
    """The agent's next step: tool calls, or its reply."""
    tools = {t["function"]["name"] for t in context.tools}
    done = _this_turn(messages)
    said = " ".join(m["content"] for m in messages if m["role"] == "user")
    found = ORDER.findall(said)
    if not found:
        if len([m for m in messages if m["role"] == "user"]) <= 1:
            return "Hello, thanks for getting in touch. Which order is it about (its number)?"
        return "Could you give me your order number, please?"
    order = found[-1]
    if not done and "find_order" in tools:
        return {"tool_calls": [{"name": "find_order", "arguments": {"order_id": order}}]}
    last, result = done[-1] if done else ("", {})
    if "error" in result:
        return "I'm sorry, I could not change that order. Let me pass this to a colleague."
    if last == "find_order":
        if result["status"] not in ("shipped", "cancelled") and "cancel_order" in tools:
            return {"tool_calls": [
                {"name": "cancel_order", "arguments": {"order_id": order}},
                {"name": "refund", "arguments": {"order_id": order, "amount": result["paid"]}},
            ]}
        return (f"Order {order} is {result['status']}. Is there anything else I can do for "
                "you?")
    if last in ("cancel_order", "refund"):
        return (f"I've cancelled order {order} and started a full refund; it reaches your "
                "account within five working days. Anything else?")
    return "You're welcome, goodbye."
