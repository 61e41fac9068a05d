"""OpenEnv environments (openenv-core 0.3.0 servers) as an agentrl task (``openenv``),
driven through OpenEnv's own client, rewarded by the server. Needs the ``openenv`` extra
(`library.INSTALL`). See `agentrl.environments.tasks.openenv.task` and docs/tasks.md
"openenv"."""
