"""`agentrl-supervisor status`: URL derivation, redaction, formatting, an unavailable API."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agentrl.ops.cli import agentrl_supervisor as cli
from agentrl.ops.report.status import (
    ManagementClient,
    ManagementUnavailable,
    QueueStat,
    StatusError,
    format_status,
    management_settings,
    status_json,
)

SECRET = "s3cr:t/pw"  # ':' and '/' are URL-quoted in the AMQP URL


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- management_settings -----------------------------------------------------------------------


def test_management_url_derived_from_amqp_url() -> None:
    base, user, password, vhost = management_settings(
        "amqp://alice:s3cr%3At%2Fpw@rabbit.example:5673/", env={}
    )
    assert (base, user, password, vhost) == ("http://rabbit.example:15672", "alice", SECRET, "/")


def test_vhost_from_path_and_guest_default() -> None:
    base, user, password, vhost = management_settings("amqp://10.0.0.2/prod%2Fa", env={})
    assert (base, user, password, vhost) == ("http://10.0.0.2:15672", "guest", "guest", "prod/a")


def test_env_credentials_fill_in_missing_ones() -> None:
    env = {"AGENTRL_BROKER_USER": "bob", "AGENTRL_BROKER_PASSWORD": "pw"}
    assert management_settings("amqp://h/", env=env)[1:3] == ("bob", "pw")
    # the URL's own credentials win over the environment
    assert management_settings("amqp://u:p@h/", env=env)[1:3] == ("u", "p")


def test_management_url_overrides_host_and_credentials() -> None:
    base, user, password, _ = management_settings(
        "amqp://u:p@h:5672/", "https://m:q@mgmt.example:8443/rabbit/", env={}
    )
    assert (base, user, password) == ("https://mgmt.example:8443/rabbit", "m", "q")
    base, user, password, _ = management_settings("amqp://u:p@h/", "http://mgmt:1", env={})
    assert (base, user, password) == ("http://mgmt:1", "u", "p")


def test_non_amqp_url_is_refused() -> None:
    with pytest.raises(ValueError, match="amqp://"):
        management_settings("memory://x", env={})


# -- errors ------------------------------------------------------------------------------------


def test_closed_port_says_how_to_enable_the_plugin_and_never_shows_the_password() -> None:
    port = _closed_port()
    client = ManagementClient(f"http://127.0.0.1:{port}", "alice", SECRET, timeout=2.0)
    with pytest.raises(ManagementUnavailable) as info:
        client.queue_stats("run1")
    text = str(info.value)
    assert "rabbitmq-plugins enable rabbitmq_management" in text
    assert f"127.0.0.1:{port}" in text
    assert SECRET not in text and "s3cr%3At%2Fpw" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, object]] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        code, body = self.routes.get(path, (404, {"error": "Object Not Found"}))
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"routes": {}, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()
    thread.join()


def test_404_on_overview_is_management_unavailable(fake_api) -> None:
    url, _ = fake_api
    client = ManagementClient(url, "guest", SECRET)
    with pytest.raises(ManagementUnavailable, match="rabbitmq-plugins enable rabbitmq_management"):
        client.queue_stats("run1")


def test_bad_credentials_are_reported_without_the_password(fake_api) -> None:
    url, handler = fake_api
    handler.routes["/api/queues/%2F"] = (401, {"error": "not_authorised"})
    handler.routes["/api/overview"] = (401, {"error": "not_authorised"})
    with pytest.raises(StatusError) as info:
        ManagementClient(url, "alice", SECRET).queue_stats("run1")
    assert "401" in str(info.value) and "alice" in str(info.value)
    assert SECRET not in str(info.value)
    assert not isinstance(info.value, ManagementUnavailable)


def test_malformed_url_error_is_redacted() -> None:
    client = ManagementClient(f"http://alice:{SECRET}@127.0.0.1:1", "alice", SECRET)
    with pytest.raises(StatusError) as info:
        client.overview()
    assert "s3cr" not in str(info.value)
    assert "InvalidURL" in str(info.value)


ROWS = [
    {
        "name": "run1.episodes",
        "messages_ready": 5,
        "messages_unacknowledged": 2,
        "consumers": 1,
        "message_stats": {"publish_details": {"rate": 1.5}, "deliver_get_details": {"rate": 0.25}},
    },
    {"name": "run1.dead", "messages_ready": 3, "messages_unacknowledged": 0, "consumers": 0},
    {"name": "run10.episodes", "messages_ready": 9, "messages_unacknowledged": 0, "consumers": 0},
    {"name": "agentrl-excl-run1-sampler-0-0123456789ab", "consumers": 1},
    {"name": "agentrl-excl-other-learner-0123456789ab", "consumers": 1},
]


def test_queue_stats_filters_the_run_and_defaults_missing_stats(fake_api) -> None:
    url, handler = fake_api
    handler.routes["/api/queues/%2F"] = (200, ROWS)
    stats = ManagementClient(url, "guest", "guest").queue_stats("run1")
    assert [s.name for s in stats] == [
        "agentrl-excl-run1-sampler-0-0123456789ab",
        "run1.dead",
        "run1.episodes",
    ]
    # no messages_ready / messages_unacknowledged reported: unknown, not 0
    assert stats[0] == QueueStat(
        "agentrl-excl-run1-sampler-0-0123456789ab", None, None, 1, 0.0, 0.0
    )
    assert stats[2] == QueueStat("run1.episodes", 5, 2, 1, 1.5, 0.25)
    path, auth = handler.seen[0]
    assert path.startswith("/api/queues/%2F?columns=name,messages_ready,")
    assert auth == "Basic Z3Vlc3Q6Z3Vlc3Q="  # base64("guest:guest")


# -- formatting and the command line -----------------------------------------------------------


def test_format_status_table() -> None:
    stats = [
        QueueStat("run1.dead", 3, 0, 0, 0.0, 0.0),
        QueueStat("run1.episodes", 12, 2, 1, 1.5, 0.25),
    ]
    assert format_status(stats, "run1").splitlines() == [
        "queue          depth  unacked  publish/s  deliver/s  consumers",
        "run1.dead          3        0       0.00       0.00          0",
        "run1.episodes     12        2       1.50       0.25          1",
        "dead letters: 3",
    ]
    assert format_status([], "run1").splitlines()[1:] == [
        "(no queues of run 'run1')",
        "dead letters: 0",
    ]


def test_format_status_marks_unreported_queues() -> None:
    lines = format_status([QueueStat("run1.dead", None, None, None, 0.0, 0.0)], "run1").splitlines()
    assert lines[1].split() == ["run1.dead", "?", "?", "0.00", "0.00", "?"]
    assert lines[2:] == [
        "dead letters: ?",
        "?: no statistics reported yet (an idle queue since the plugin started)",
    ]


def test_status_json() -> None:
    data = json.loads(status_json([QueueStat("r.dead", 4, 0, 0, 0.0, 0.0)], "r"))
    assert data["dead_letters"] == 4
    assert data["queues"][0] == {
        "name": "r.dead",
        "depth": 4,
        "unacked": 0,
        "consumers": 0,
        "publish_rate": 0.0,
        "deliver_rate": 0.0,
    }


def test_cli_status_memory_broker_exits_2(capsys) -> None:
    assert cli.main(["status", "--broker", "memory://x", "--run", "r"]) == 2
    assert "only exists inside" in capsys.readouterr().err


def test_cli_status_table_and_json(fake_api, capsys) -> None:
    url, handler = fake_api
    handler.routes["/api/queues/%2F"] = (200, ROWS)
    args = ["status", "--broker", "amqp://guest:guest@h/", "--run", "run1"]
    assert cli.main([*args, "--management-url", url]) == 0
    out = capsys.readouterr().out
    assert "run1.episodes" in out and "run10" not in out and "dead letters: 3" in out
    assert cli.main([*args, "--management-url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dead_letters"] == 3


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_cli_status_with_the_broker_down_says_so_and_exits_1_without_password(
    capsys, json_flag
) -> None:
    """Management API and broker both silent: the line names the broker as down (not the
    plugin); with --json, stdout is JSON too."""
    port = _closed_port()
    broker = f"amqp://alice:{SECRET.replace(':', '%3A').replace('/', '%2F')}@127.0.0.1:{port}/"
    url = f"http://127.0.0.1:{port}"
    args = ["status", "--broker", broker, "--run", "r", "--management-url", url, *json_flag]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "the broker is down" in lines[0], captured.err
    assert "rabbitmq-plugins" not in captured.err
    for text in (captured.err, captured.out):
        assert SECRET not in text and "s3cr%3At%2Fpw" not in text
    if json_flag:
        answer = json.loads(captured.out)
        assert answer["run"] == "r" and "the broker is down" in answer["error"]
    else:
        assert captured.out == ""


def test_cli_status_with_only_the_management_api_silent_names_the_plugin(
    capsys, monkeypatch
) -> None:
    monkeypatch.setattr(cli, "broker_problem", lambda broker, name: None)  # the broker answers
    url = f"http://127.0.0.1:{_closed_port()}"
    args = ["status", "--broker", "amqp://guest:guest@127.0.0.1/", "--run", "r"]
    assert cli.main([*args, "--management-url", url]) == 1
    assert "rabbitmq-plugins enable rabbitmq_management" in capsys.readouterr().err


def test_controller_status_over_rpc_and_its_text(tmp_path) -> None:
    import uuid

    import pykka

    from agentrl.actors import ControllerActor, SamplerActor, TaskEntry, TopologySpec
    from agentrl.actors._fakes import ScriptedEngine
    from agentrl.messages import CheckpointReady, MetricsReport, Topology, connect, encode
    from agentrl.ops.report.status import controller_status, format_controller

    run = f"st-{uuid.uuid4().hex[:6]}"
    broker = f"memory://{run}"
    spec = TopologySpec(run, ("current",), 16)
    try:
        ControllerActor.start(
            broker=broker,
            topology=spec,
            tasks={"calculator": TaskEntry(1.0, 10)},
            group_size=2,
            episodes_per_batch=4,
            max_staleness=1,
            initial=CheckpointReady(3, "/x", "", 0.0),
        ).proxy().stats().get()
        for i in range(2):
            SamplerActor.start(
                broker=broker,
                topology=spec,
                pool="current",
                every=1,
                engine_factory=lambda: ScriptedEngine(lambda p, v: [1]),
                sampler_id=f"s{i}",
                query_timeout=1.0,
                node="gpu-1",
            ).proxy().stats().get()
        client = connect(broker, name="t")
        learner = {"env/calculator/reward": 0.5, "env/calculator/success": 0.25,
                   "env/calculator/episodes": 4.0, "rollout/episodes": 4.0,
                   "rollout/episodes_per_s": 2.0, "staleness/issue_lag_mean": 0.75,
                   "learner/idle_ratio": 0.125}  # fmt: skip
        report = MetricsReport(source="learner", step=3, values=learner)
        client.publish(Topology(run).control, "metrics.learner", encode(report, run=run)).result(5)
        deadline = time.monotonic() + 10
        values = None
        while time.monotonic() < deadline:
            values = controller_status(broker, run)
            if (
                values
                and values.get("actors/gpu-1/sampler/alive") == 2
                and "env/calculator/reward" in values
            ):
                break
            time.sleep(0.1)
        # the samplers could not load "/x" (no such checkpoint): they still serve version 0
        assert values["pool/current/version_min"] == values["pool/current/version_max"] == 0
        assert (
            values["controller/version"] == 3 and values["controller/issued"] == 20
        )  # (3 + 1 + 1) * 4
        text = format_controller(values)
        assert "policy version 3, episodes issued 20, dropped 0" in text
        assert "node gpu-1: sampler x2 alive" in text
        assert "pool current: 2 sampler(s) serving version 0" in text
        assert "staleness: issue_lag_mean 0.75" in text
        assert "idle ratio: learner 0.12" in text
        assert "task calculator: reward +0.50, success 0.25, 2.00 ep/s" in text
        client.close()
    finally:
        pykka.ActorRegistry.stop_all()
    assert controller_status(f"memory://{run}-nobody", run, timeout=0.5) is None
    assert "no answer" in format_controller(None)


def test_cli_status_needs_a_broker_and_reads_it_from_a_file(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("AGENTRL_BROKER_URL", raising=False)
    assert cli.main(["status", "--run", "r"]) == 2
    assert "give --broker or set $AGENTRL_BROKER_URL" in capsys.readouterr().err
    assert cli.main(["stop", "--run", "r", "--broker", f"@{tmp_path / 'nope'}"]) == 2
    assert "cannot read the broker URL" in capsys.readouterr().err
    (tmp_path / "url").write_text("memory://somewhere\n")
    monkeypatch.setenv("AGENTRL_BROKER_URL", f"@{tmp_path / 'url'}")
    assert cli.main(["status", "--run", "r"]) == 2  # read from the file: a memory:// broker
    assert "only exists inside" in capsys.readouterr().err
