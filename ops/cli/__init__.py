"""The commands, one module each, named after the command (setup.cfg's console scripts):

- ``agentrl_supervisor.py``: ``agentrl-supervisor`` (start a run's roles on a node, status, stop);
- ``agentrl.py``: ``agentrl`` (eval, compare, report, sft, serve, trace);
- ``agentrl_env.py``: ``agentrl-env`` (check a task) and ``agentrl-env-worker`` (serve one
  over the broker; it runs in an image without torch, so its imports stay light).

Nothing is imported here: each command loads only what it needs.
"""
