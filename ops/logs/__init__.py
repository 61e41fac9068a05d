"""Logging, configured only at entry points: ``configure.py`` (`configure_logging`: console
lines and JSON lines per role), ``bars.py`` (transformers' progress bars as one log line,
imported only where transformers is).

Nothing is imported here: an environment worker has no tqdm.
"""
