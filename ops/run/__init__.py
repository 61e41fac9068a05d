"""The supervisor and what a live run needs:

- ``supervisor.py``: `Supervisor`, the roles of one node in this process (start, watch, stop);
- ``node.py``: `NodeSupervisor`, each role as a child process (restarts, drain);
- ``run_lock.py``: one learner per run (the directory lock and the broker lock);
- ``preflight.py``: the model and broker checks before anything is written;
- ``interrupt.py``, ``disk.py``, ``progress.py``: Ctrl-C, the disk check, the progress line.

Nothing is imported here (the supervisor needs torch).
"""
