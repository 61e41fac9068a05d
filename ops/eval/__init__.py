"""Evaluation: ``evaluate.py`` (`evaluate`, a checkpoint's pass rate per task, ``agentrl
eval``), ``episodes.py`` (its episodes on a fresh in-process broker), ``compare.py`` (a
paired comparison of two evaluations, ``agentrl compare``), ``task_split.py`` (which split a
command builds a task on).

Nothing is imported here: ``agentrl-env-worker`` uses ``task_split.py`` without torch.
"""
