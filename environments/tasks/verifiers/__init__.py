"""verifiers environments (its 0.4.0 ``verifiers.v1`` tasksets and Envs) as agentrl tasks
(``verifiers:<taskset id>``), scored by the taskset's own rewards. Needs the ``verifiers``
extra (`library.INSTALL`). See `agentrl.environments.tasks.verifiers.task` and docs/tasks.md
"verifiers"."""
