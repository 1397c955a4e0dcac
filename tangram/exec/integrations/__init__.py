"""Adapters that let RL frameworks use Tangram through their own interfaces (verl's tools)."""
