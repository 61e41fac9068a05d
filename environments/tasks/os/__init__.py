"""The ``os`` task: do things on a Linux machine, or find answers on it (AgentBench OS).

The environment is :class:`OSTask` (module ``task``); see its module docstring.
"""

from agentrl.environments.tasks.os.task import OSTask

__all__ = ["OSTask"]
