"""BFCL, the Berkeley Function Calling Leaderboard, from the ``bfcl-eval`` package: its data,
possible answers, checkers and executable multi-turn backends, scored by BFCL's own code.
See `agentrl.environments.tasks.bfcl.task` and docs/tasks.md "BFCL"."""
