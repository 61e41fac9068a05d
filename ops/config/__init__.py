"""The run configuration: ``schema.py`` (the YAML's fields as typed dataclasses, `RunConfig`
at the top), ``load.py`` (read, parse and validate a file: `load_config`, `ConfigError`),
``typed.py`` (plain data into dataclasses, every problem collected).

`agentrl.ops` re-exports the public names.
"""
