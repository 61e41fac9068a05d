"""How a run is shown: ``plots.py`` (``agentrl report``: plots and a summary from
``metrics.jsonl``), ``tensorboard.py`` (the TensorBoard event files the learner's metrics
go to), ``status.py`` (``agentrl-supervisor status``: the queues and the controller's view).

Nothing is imported here: each is loaded where it is used.
"""
