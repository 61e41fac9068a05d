"""The ``alfworld`` task: household chores in an ALFWorld-style text world.

The environment is :class:`AlfworldTask` (module ``task``); see its module docstring.
"""

from agentrl.environments.tasks.alfworld.task import AlfworldTask

__all__ = ["AlfworldTask"]
