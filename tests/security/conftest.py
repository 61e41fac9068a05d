"""Fixtures of the security suites: the MySQL/MariaDB ``server`` of the integration suite."""

from tests.integration.conftest import server  # noqa: F401  (a fixture, shared)
