"""Test helpers that ship with spasm: an OpenAI-compatible server with fault injection."""

from spasm.testing.server import FaultPlan, TestServer

__all__ = ["FaultPlan", "TestServer"]
