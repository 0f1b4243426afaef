"""A small shop's tools (docs/tools.md): the agent looks orders up, cancels and refunds them;
the customer checks the shop's app on their phone (their own action: dual control).

Each tool is called as ``fn(world, **arguments)``; the world is the scenario's state (see
``world.json``), a fresh copy in every dialogue. Its JSON schema comes from the type hints and
the docstring. Raise to refuse: the agent sees the error and goes on.
"""

from __future__ import annotations

from typing import Any

import spasm


def _order(world: dict[str, Any], order_id: str) -> dict[str, Any]:
    order = world["orders"].get(order_id.strip().lstrip("#"))
    if order is None:
        raise KeyError(f"no order {order_id!r}")
    return order


@spasm.tool(owner="responder", notice="[The agent is looking up your order]")
def find_order(world: dict[str, Any], order_id: str) -> dict[str, Any]:
    """Look an order up: its items, status and what was paid.

    Args:
        order_id: The order number, as the customer gives it (e.g. 4471).
    """
    return dict(_order(world, order_id))


@spasm.tool(owner="responder", mutates=True, notice="[The agent is cancelling your order]")
def cancel_order(world: dict[str, Any], order_id: str) -> dict[str, Any]:
    """Cancel an order that has not shipped yet.

    Args:
        order_id: The order number.
    """
    order = _order(world, order_id)
    if order["status"] == "shipped":
        raise ValueError("the order has shipped; it cannot be cancelled, only returned")
    order["status"] = "cancelled"
    return {"order_id": order_id, "status": "cancelled"}


@spasm.tool(owner="responder", mutates=True, visible_to="all")
def refund(world: dict[str, Any], order_id: str, amount: float) -> dict[str, Any]:
    """Refund (part of) what an order cost; everyone present sees the refund.

    Args:
        order_id: The order number.
        amount: How much to refund, at most what was paid and not yet refunded.
    """
    order = _order(world, order_id)
    left = round(order["paid"] - order.get("refunded", 0.0), 2)
    if not 0 < amount <= left:
        raise ValueError(f"a refund is between 0 and {left} for this order")
    order["refunded"] = round(order.get("refunded", 0.0) + amount, 2)
    return {"order_id": order_id, "refunded": order["refunded"]}


@spasm.tool(owner="client")
def check_app(world: dict[str, Any]) -> dict[str, Any]:
    """Open the shop's app on your phone and read your latest order's status."""
    latest = world["customer"]["latest_order"]
    order = world["orders"][latest]
    return {"order": latest, "status": order["status"], "refunded": order.get("refunded", 0.0)}
