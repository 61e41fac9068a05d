"""`agentrl-supervisor status`: a run's queues as the RabbitMQ management HTTP API sees them.

Standard library only (`urllib.request`, basic auth). The password is never printed or logged:
every error message goes through `_redact`.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from agentrl.messages import (
    BrokerUnavailable,
    MetricsReport,
    StatusQuery,
    Topology,
    TransportError,
    connect,
    decode,
    encode,
)

__all__ = [
    "ManagementClient",
    "ManagementUnavailable",
    "QueueStat",
    "StatusError",
    "client_for",
    "dead_letters",
    "format_status",
    "management_settings",
    "status_json",
]

MANAGEMENT_PORT = 15672
_COLUMNS = (
    "name",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
    "message_stats.publish_details.rate",
    "message_stats.deliver_get_details.rate",
)
UNKNOWN = "?"
ENABLE_HINT = "enable it with `rabbitmq-plugins enable rabbitmq_management`"


class StatusError(Exception):
    """Raised when the management API answers with an error (bad credentials, unknown vhost)."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status
        """The HTTP status code of the answer, when there was one."""


class ManagementUnavailable(StatusError):
    """Raised when nothing serves the management API (plugin not enabled, port closed)."""


@dataclass(frozen=True, slots=True)
class QueueStat:
    """One queue of a run, as the management API reports it."""

    name: str
    """Full queue name, e.g. `run1.episodes`."""
    depth: int | None
    """Ready messages (`messages_ready`); None while the broker has reported no statistics
    for the queue (an idle queue declared before the management plugin was enabled)."""
    unacked: int | None
    """Delivered, not yet acknowledged (`messages_unacknowledged`); None as for `depth`."""
    consumers: int | None
    """Number of consumers; None as for `depth`."""
    publish_rate: float
    """Messages/s published (`message_stats.publish_details.rate`; 0 when absent)."""
    deliver_rate: float
    """Messages/s delivered (`message_stats.deliver_get_details.rate`; 0 when absent)."""


def _redact(text: str, password: str | None) -> str:
    """`text` with every occurrence of the password (raw and URL-quoted) replaced by '***'."""
    if not password:
        return text
    for form in {password, urllib.parse.quote(password, safe=""), urllib.parse.quote(password)}:
        text = text.replace(form, "***")
    return text


def management_settings(
    broker_url: str, management_url: str | None = None, env: dict[str, str] | None = None
) -> tuple[str, str, str, str]:
    """(base_url without credentials, user, password, vhost) for a broker URL.

    By default: http on the AMQP host, port 15672. Credentials: those of `management_url`,
    else of the AMQP URL, else `AGENTRL_BROKER_USER`/`AGENTRL_BROKER_PASSWORD`, else guest.
    The vhost is the AMQP URL's path (`/` when empty).
    """
    env = os.environ if env is None else env
    amqp = urllib.parse.urlsplit(broker_url)
    if amqp.scheme not in ("amqp", "amqps"):
        raise ValueError(f"status needs an amqp:// or amqps:// broker URL, got {amqp.scheme}://")
    path = amqp.path[1:] if amqp.path.startswith("/") else amqp.path
    vhost = urllib.parse.unquote(path) or "/"
    user = urllib.parse.unquote(amqp.username) if amqp.username else None
    password = urllib.parse.unquote(amqp.password) if amqp.password is not None else None
    if management_url:
        mgmt = urllib.parse.urlsplit(management_url)
        if mgmt.username:
            user = urllib.parse.unquote(mgmt.username)
            password = urllib.parse.unquote(mgmt.password or "")
        host = mgmt.hostname or "127.0.0.1"
        netloc = f"[{host}]" if ":" in host else host
        if mgmt.port:
            netloc += f":{mgmt.port}"
        base = urllib.parse.urlunsplit((mgmt.scheme or "http", netloc, mgmt.path, "", ""))
    else:
        host = amqp.hostname or "127.0.0.1"
        netloc = f"[{host}]" if ":" in host else host
        base = f"http://{netloc}:{MANAGEMENT_PORT}"
    user = user or env.get("AGENTRL_BROKER_USER") or "guest"
    if password is None:
        password = env.get("AGENTRL_BROKER_PASSWORD", "guest")
    return base.rstrip("/"), user, password, vhost


class ManagementClient:
    """Reads queue statistics from the RabbitMQ management HTTP API."""

    def __init__(
        self, base_url: str, user: str, password: str, vhost: str = "/", *, timeout: float = 5.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.vhost = vhost
        self._user = user
        self._password = password
        self._timeout = timeout
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self._auth = f"Basic {token}"

    def _get(self, path: str) -> Any:
        url = f"{self.base_url}{path}"
        request = urllib.request.Request(url, headers={"Authorization": self._auth})
        safe_url = _redact(url, self._password)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and path.startswith("/api/overview"):
                raise ManagementUnavailable(
                    f"RabbitMQ management API not found at {safe_url} (HTTP 404); {ENABLE_HINT}"
                ) from None
            detail = _redact(f"HTTP {exc.code} {exc.reason}", self._password)
            raise StatusError(
                f"management API {safe_url} answered {detail} (user {self._user!r})",
                http_status=exc.code,
            ) from None
        except (ValueError, http.client.HTTPException) as exc:
            # a malformed URL or answer; its text may hold fragments of the URL: leave it out
            raise StatusError(f"management API {safe_url}: {type(exc).__name__}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            detail = _redact(str(reason), self._password)
            raise ManagementUnavailable(
                f"RabbitMQ management API unreachable at {safe_url} ({detail}); {ENABLE_HINT}"
            ) from None

    def overview(self) -> dict[str, Any]:
        """GET /api/overview (raises ManagementUnavailable when the plugin is not there)."""
        result: dict[str, Any] = self._get("/api/overview")
        return result

    def queue_stats(self, run: str) -> list[QueueStat]:
        """Every queue of `run`, sorted by name: `<run>.*` and the run's auto-named queues."""
        vhost = urllib.parse.quote(self.vhost, safe="")
        columns = urllib.parse.quote(",".join(_COLUMNS), safe=",")
        try:
            rows = self._get(f"/api/queues/{vhost}?columns={columns}")
        except StatusError as exc:
            if exc.http_status == 404:  # tell a missing plugin apart from a missing vhost
                self.overview()
            raise
        # Auto-named queues are `agentrl-<kind>-<transport name[:40]>-<hex>`; the actors'
        # transport names start with `<run>-`.
        auto = re.compile(rf"agentrl-[a-z]+-{re.escape(f'{run}-'[:40])}")
        stats = [
            _queue_stat(row)
            for row in rows
            if row.get("name", "").startswith(f"{run}.") or auto.match(row.get("name", ""))
        ]
        return sorted(stats, key=lambda s: s.name)


def _queue_stat(row: dict[str, Any]) -> QueueStat:
    msg = row.get("message_stats") or {}

    def rate(key: str) -> float:
        return float((msg.get(key) or {}).get("rate", 0.0))

    def count(key: str) -> int | None:
        value = row.get(key)
        return None if value is None else int(value)

    return QueueStat(
        name=row["name"],
        depth=count("messages_ready"),
        unacked=count("messages_unacknowledged"),
        consumers=count("consumers"),
        publish_rate=rate("publish_details"),
        deliver_rate=rate("deliver_get_details"),
    )


def client_for(
    broker_url: str, management_url: str | None = None, *, timeout: float = 5.0
) -> ManagementClient:
    """A ManagementClient for an amqp:// URL (see `management_settings`)."""
    base, user, password, vhost = management_settings(broker_url, management_url)
    return ManagementClient(base, user, password, vhost, timeout=timeout)


def dead_letters(stats: list[QueueStat], run: str) -> int | None:
    """Depth of `<run>.dead` (0 when the queue does not exist, None when not reported)."""
    return next((s.depth for s in stats if s.name == f"{run}.dead"), 0)


def _show(value: int | None) -> str:
    return UNKNOWN if value is None else str(value)


def format_status(stats: list[QueueStat], run: str | None = None) -> str:
    """A table: queue, depth, unacked, publish/s, deliver/s, consumers; then dead letters."""
    header = ("queue", "depth", "unacked", "publish/s", "deliver/s", "consumers")
    rows = [
        (
            s.name,
            _show(s.depth),
            _show(s.unacked),
            f"{s.publish_rate:.2f}",
            f"{s.deliver_rate:.2f}",
            _show(s.consumers),
        )
        for s in stats
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join([r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in range(1, len(r)))])
        for r in [header, *rows]
    ]
    if not stats:
        lines.append("(no queues)" if run is None else f"(no queues of run {run!r})")
    if run is not None:
        lines.append(f"dead letters: {_show(dead_letters(stats, run))}")
    if any(s.depth is None for s in stats):
        lines.append(
            f"{UNKNOWN}: no statistics reported yet (an idle queue since the plugin started)"
        )
    return "\n".join(lines)


def status_json(
    stats: list[QueueStat], run: str, controller: dict[str, float] | None = None
) -> str:
    """The same information as JSON (``controller``: the controller's status values)."""
    payload = {
        "run": run,
        "dead_letters": dead_letters(stats, run),
        "queues": [asdict(s) for s in stats],
        "controller": controller,
    }
    return json.dumps(payload, indent=2)


# --- the controller's view ---------------------------------------------------------


def controller_status(broker: str, run: str, timeout: float = 5.0) -> dict[str, float] | None:
    """The controller's `status()` through a StatusQuery RPC; None when no controller answers."""
    try:
        transport = connect(broker, name=f"{run}-status-query", connect_timeout=timeout)
    except BrokerUnavailable:
        return None
    try:
        query = encode(StatusQuery(requester="agentrl-supervisor status"), run=run)
        try:
            reply = transport.call("", Topology(run).control_rpc, query, timeout=timeout)
            body = reply.result(timeout=timeout + 1).body
        except (TransportError, TimeoutError):
            return None
        return dict(decode(body, expect=MetricsReport).payload.values)
    finally:
        transport.close()


def format_controller(values: dict[str, float] | None) -> str:
    """Nodes and roles, versions per pool, staleness and per-task figures, as text lines."""
    if values is None:
        return "controller: no answer (is the run's controller up?)"
    lines = [
        f"policy version {int(values.get('controller/version', -1))}, "
        f"episodes issued {int(values.get('controller/issued', 0))}, "
        f"dropped {int(values.get('controller/dropped', 0))}"
    ]
    actors: dict[tuple[str, str], dict[str, int]] = {}
    for key, value in values.items():
        if key.startswith("actors/"):
            _, node, role, state = key.split("/")
            actors.setdefault((node, role), {})[state] = int(value)
    for (node, role), counts in sorted(actors.items()):
        silent = f", {counts['silent']} silent" if counts.get("silent") else ""
        lines.append(f"node {node}: {role} x{counts.get('alive', 0)} alive{silent}")
    pools = sorted({k.split("/")[1] for k in values if k.startswith("pool/")})
    for pool in pools:
        low = int(values[f"pool/{pool}/version_min"])
        high = int(values[f"pool/{pool}/version_max"])
        shown = str(low) if low == high else f"{low}..{high}"
        n = int(values[f"pool/{pool}/samplers"])
        lines.append(f"pool {pool}: {n} sampler(s) serving version {shown}")
    lag = [
        f"{name.split('/', 1)[1]} {values[name]:.2f}"
        for name in sorted(values)
        if name.startswith("staleness/") and not name.endswith("_max")
    ]
    if lag:
        lines.append("staleness: " + ", ".join(lag))
    idle = [
        f"{role} {values[f'{role}/idle_ratio']:.2f}"
        for role in ("learner", "rollout")
        if f"{role}/idle_ratio" in values
    ]
    if idle:
        lines.append("idle ratio: " + ", ".join(idle))
    lines.extend(_env_workers(values))
    tasks = sorted({k.split("/")[1] for k in values if k.startswith("env/")})
    rate = values.get("rollout/episodes_per_s")
    for task in tasks:
        reward = values.get(f"env/{task}/reward", float("nan"))
        success = values.get(f"env/{task}/success", float("nan"))
        episodes = values.get(f"env/{task}/episodes", 0.0)
        share = (
            f", {rate * episodes / max(values.get('rollout/episodes', 1.0), 1.0):.2f} ep/s"
            if rate
            else ""
        )
        lines.append(f"task {task}: reward {reward:+.2f}, success {success:.2f}{share}")
    return "\n".join(lines)


_WORKER_STATES = {0: "alive", 1: "unresponsive", 2: "dead"}


def _env_workers(values: dict[str, float]) -> list[str]:
    """Lines for the env worker registry (`env_workers/`, `env_worker/`, `env_sessions/` rows)."""
    if "env_workers/alive" not in values:
        return []
    counts = ", ".join(
        f"{int(values.get(f'env_workers/{s}', 0))} {s}" for s in ("alive", "unresponsive", "dead")
    )
    sessions = {
        k.split("/", 1)[1]: int(v) for k, v in values.items() if k.startswith("env_sessions/")
    }
    lines = [
        f"env workers: {counts}; sessions {sessions.get('live', 0)} live, "
        f"{sessions.get('claimed', 0)} held by rollouts, "
        f"{sessions.get('orphans_cancelled', 0)} orphans cancelled, "
        f"{sessions.get('lost', 0)} lost, {sessions.get('idle_expired', 0)} idle expired"
    ]
    workers = sorted(
        {tuple(k.split("/")[1:3]) for k in values if k.startswith("env_worker/")},
        key=lambda tw: (tw[0], tw[1]),
    )
    for task, wid in workers:
        row = f"env_worker/{task}/{wid}"
        state = _WORKER_STATES.get(int(values.get(f"{row}/state", -1)), "?")
        lines.append(
            f"  worker {wid} ({task}): {state}, "
            f"{int(values.get(f'{row}/sessions', 0))}/{int(values.get(f'{row}/capacity', 0))} "
            f"sessions, last report {values.get(f'{row}/age', float('nan')):.1f} s ago, "
            f"up {values.get(f'{row}/up_for', float('nan')):.0f} s"
        )
    return lines
