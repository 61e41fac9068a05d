"""A number-guessing tool task for agentrl, written outside agentrl (docs/own-task.md)."""

from guessing.task import CHECK_AGENTS, GuessingTask

__all__ = ["CHECK_AGENTS", "GuessingTask"]
