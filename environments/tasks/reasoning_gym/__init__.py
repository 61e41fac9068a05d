"""reasoning-gym's procedurally generated datasets as agentrl tasks (``reasoning_gym:<dataset>``),
scored by each dataset's own ``score_answer``. Needs the ``reasoning-gym`` extra
(`library.INSTALL`). See `agentrl.environments.tasks.reasoning_gym.task` and docs/tasks.md
"reasoning_gym"."""
