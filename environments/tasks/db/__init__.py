"""The ``db`` task: answer questions about a table, or change it, with SQL (AgentBench DB).

The environment is :class:`DBTask` (module ``task``); see its module docstring.
"""

from agentrl.environments.tasks.db.task import DBTask

__all__ = ["DBTask"]
