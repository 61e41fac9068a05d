"""The supervised warm start, ``agentrl sft``: ``train.py`` (`run_sft`), ``data.py`` (oracle
episodes in the rollout's token format), ``warm_start.py`` (the record it leaves in the run
directory and the KL reference it implies).

Nothing is imported here (training needs torch).
"""
