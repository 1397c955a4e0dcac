"""Tangram: action-level orchestration of the external resources of agentic RL."""

__version__ = "0.1.0"
