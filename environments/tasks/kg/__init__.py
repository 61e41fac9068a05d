"""The ``kg`` task: answer a question by walking a Freebase-like knowledge graph (AgentBench KG).

The environment is :class:`KGTask` (module ``task``); see its module docstring.
"""

from agentrl.environments.tasks.kg.task import KGTask

__all__ = ["KGTask"]
