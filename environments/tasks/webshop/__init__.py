"""The ``webshop`` task: find and buy the product an instruction asks for (WebShop).

The environment is :class:`WebShopTask` (module ``task``); see its module docstring.
"""

from agentrl.environments.tasks.webshop.task import WebShopTask

__all__ = ["WebShopTask"]
