"""The built-in tasks, one folder each, over one shared toolkit.

Each ``tasks/<name>/`` holds one task: ``task.py`` (the environment class, its tools and
prompts), its world or backend, its judge, its data loader, its graded levels
(``levels.py``), its scripted check agents (``agents.py``) and its data (``data/``).
What the tasks share lives once in ``tasks/toolkit/``: train/test splits
(``split.py``), graded-level plans (``levels.py``) and the per-episode plumbing
(``episode.py``: sessions, AgentBench-style bad-call replies, turn limits, endings).

A new task is one new folder: copy one, register its class in
``agentrl.environments._registry`` (or call :func:`agentrl.environments.register_task`).
Tasks are imported on first use, so importing this package costs nothing.
"""
