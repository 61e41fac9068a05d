"""The supervisor and what a live run needs:

- ``supervisor.py``: `Supervisor`, the roles of one node in this process (start, watch, stop);
- ``roles.py``: the roles and each role's actor arguments built from the config;
- ``engines.py``: the pools' sampler engines, the learner backend, the torch threads;
- ``node.py``: `NodeSupervisor`, each role as a child process (restarts, drain);
- ``run_dir.py``: a run directory's newest checkpoint, earlier start and config;
- ``queues.py``: probe the run's queues, clear an earlier run's, broadcast the stop;
- ``run_lock.py``: one learner per run (the directory lock and the broker lock);
- ``preflight.py``: the model and broker checks before anything is written;
- ``interrupt.py``, ``disk.py``, ``progress.py``: Ctrl-C, the disk check, the progress line.

Nothing is imported here (the supervisor needs torch).
"""
