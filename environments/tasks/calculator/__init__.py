"""The built-in ``calculator`` task: arithmetic solved with two tools.

The environment is :class:`CalculatorTask` (module ``task``); see its module docstring.
"""

from agentrl.environments.tasks.calculator.task import CalculatorTask

__all__ = ["CalculatorTask"]
