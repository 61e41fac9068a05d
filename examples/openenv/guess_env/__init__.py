"""guess_env: a small OpenEnv environment (openenv-core 0.3.0) that runs offline: guess a
number from 1 to 64, told "higher" or "lower", scored on the server by an OpenEnv
``Rubric``. Served by ``uvicorn guess_env.server.app:app``; agentrl plays it as task
``openenv`` with ``app: guess_env.server.app:app`` (docs/tasks.md "openenv")."""
