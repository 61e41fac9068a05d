"""Run test "nodes" in separate Linux network namespaces against the one local RabbitMQ.

`NetnsCluster(n)` (or `namespaces(n)`, which first calls `require_netns()`) builds, in
generation ``k``:

- a bridge ``agentrl-br<k>`` with 10.77.<k>.1/24 in the root namespace;
- namespaces ``agentrl-<pid>-<k>-n<i>``, each with ``lo`` up and ``eth0`` =
  10.77.<k>.(10+i)/24, the other end of its veth pair (``agentrl<k>v<i>``) on the bridge;
- a `Relay` on 10.77.<k>.1:5672 to 127.0.0.1:5672, so the broker sees a loopback peer
  (guest may log in) while the namespaces cannot reach the root namespace's loopback.

RabbitMQ listens only on 127.0.0.1 and is not reconfigured. A generation is claimed by an
owner file /run/agentrl-netns/<k> ("<pid> <start time>") under a lock; whatever a dead owner
left behind (a crashed run) is removed by the next cluster that starts.

    with namespaces(3, log_dir=tmp_path) as cluster:
        argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor", ...]
        procs = [cluster.popen(ns, [*argv, cluster.broker_url]) for ns in cluster.namespaces]
        ...  # os.killpg(procs[0].pid, signal.SIGKILL) kills a node; teardown kills the rest
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.integration.conftest import BROKER_HOST, BROKER_PORT

log = structlog.get_logger(__name__)

STATE_DIR = Path("/run/agentrl-netns")
BROKER_PORT_IN_NS = 5672
MAX_NODES = 245  # host addresses .10 to .254
NS_RE = re.compile(r"^agentrl-(?P<pid>\d+)-(?:(?P<k>\d+)-n\d+|probe)$")
LINK_RE = re.compile(r"^agentrl(?:-br(?P<bridge>\d+)|(?P<veth>\d+)v\d+)$")  # <= 15 chars


class NetnsError(RuntimeError):
    """Raised when an `ip` command fails while building or tearing down namespaces."""


class RelayFailed(RuntimeError):
    """Raised at teardown when the relay's own code failed (not when a peer went away)."""


def _ip(command: str) -> str:
    """Run `ip <command>` (split on whitespace); its stdout."""
    argv = ["ip", *command.split()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode:
        raise NetnsError(f"ip {command}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _ip_json(command: str) -> list[dict[str, Any]]:
    return json.loads(_ip(f"-j {command}") or "[]")


def _list_namespaces() -> list[str]:
    return [entry["name"] for entry in _ip_json("netns list")]


def _list_links() -> list[str]:
    return [entry["ifname"] for entry in _ip_json("link show")]


def _pids_in(ns: str) -> list[int]:
    return [int(pid) for pid in _ip(f"netns pids {ns}").split()]


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; comm may hold spaces


@dataclass(frozen=True)
class Owner:
    """The process that claimed a generation (pid reuse is told apart by start time)."""

    pid: int
    """Process id of the owning test process."""
    start: int
    """Its start time in clock ticks since boot (/proc/<pid>/stat field 22)."""

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        start = _start_time(pid)
        assert start is not None
        return cls(pid, start)

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start


def _owners() -> dict[int, Owner]:
    owners = {}
    for path in STATE_DIR.iterdir():
        if path.name.isdigit():
            pid, start = path.read_text().split()
            owners[int(path.name)] = Owner(int(pid), int(start))
    return owners


def _kill_and_wait(namespaces: Sequence[str], timeout: float = 5.0) -> None:
    """SIGKILL every process in `namespaces` and wait until none is left in them."""
    deadline = time.monotonic() + timeout
    while pids := [pid for ns in namespaces for pid in _pids_in(ns)]:
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} outlived SIGKILL in {list(namespaces)}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # exited since the listing
                os.kill(pid, signal.SIGKILL)
        threading.Event().wait(0.01)


def _remove(namespaces: Sequence[str], links: Sequence[str]) -> None:
    """Kill what runs in `namespaces`, then delete the links and the namespaces."""
    _kill_and_wait(namespaces)
    for link in links:  # a veth pair goes at once; its namespace may linger while dying
        _ip(f"link del {link}")
    for ns in namespaces:
        _ip(f"netns del {ns}")


def _generation(k: int) -> tuple[list[str], list[str]]:
    """(namespaces, links) of generation `k`, veths before the bridge."""
    namespaces = [ns for ns in _list_namespaces() if (m := NS_RE.match(ns)) and m["k"] == str(k)]
    links = [
        link
        for link in _list_links()
        if (m := LINK_RE.match(link)) and str(k) in (m["bridge"], m["veth"])
    ]
    return namespaces, sorted(links, key=lambda link: "-br" in link)


def _clean_stale() -> None:
    """Remove what dead owners left (call with the state lock held)."""
    for k, owner in _owners().items():
        if not owner.alive():
            log.warning("removing a crashed run's namespaces", generation=k, owner=owner.pid)
            _remove(*_generation(k))
            (STATE_DIR / str(k)).unlink()
    owners = _owners()

    def live(ns: str) -> bool:
        m = NS_RE.match(ns)
        assert m is not None
        if m["k"] is None:  # a require_netns() probe
            return _start_time(int(m["pid"])) is not None
        owner = owners.get(int(m["k"]))
        return owner is not None and owner.pid == int(m["pid"])

    def live_link(link: str) -> bool:
        m = LINK_RE.match(link)
        assert m is not None
        return int(m["bridge"] or m["veth"]) in owners

    stale_ns = [ns for ns in _list_namespaces() if NS_RE.match(ns) and not live(ns)]
    stale_links = [link for link in _list_links() if LINK_RE.match(link) and not live_link(link)]
    if stale_ns or stale_links:
        log.warning("removing ownerless namespaces", namespaces=stale_ns, links=stale_links)
        _remove(stale_ns, sorted(stale_links, key=lambda link: "-br" in link))


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    """Hold the lock under which generations are cleaned and claimed (not reentrant)."""
    STATE_DIR.mkdir(exist_ok=True)
    with open(STATE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        yield


def _claim_generation() -> int:
    """Clean stale leftovers and claim a free generation k (bridge and 10.77.<k>.0/24 free)."""
    with state_lock():
        _clean_stale()
        used = {
            ipaddress.ip_address(a["local"]).packed[2]
            for entry in _ip_json("-4 addr show")
            for a in entry.get("addr_info", [])
            if ipaddress.ip_address(a["local"]) in ipaddress.ip_network("10.77.0.0/16")
        }
        links, owners = set(_list_links()), _owners()
        for k in range(1, 255):
            if k not in used and k not in owners and f"agentrl-br{k}" not in links:
                owner = Owner.current()
                (STATE_DIR / str(k)).write_text(f"{owner.pid} {owner.start}\n")
                return k
    raise NetnsError("no free 10.77.<k>.0/24 subnet for a bridge")


class Relay:
    """A TCP relay: each connection accepted on `listen` is forwarded to `target`.

    Runs an asyncio loop in a background thread. A peer that goes away (EOF, reset, a
    killed process) ends only its own connection; `errors` collects failures of the relay's
    own code, which `NetnsCluster` turns into `RelayFailed` at teardown.
    """

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], connect_timeout: float = 5.0
    ) -> None:
        self.listen = listen
        self.target = target
        self.connect_timeout = connect_timeout
        self.accepted = 0
        """Connections accepted so far."""
        self.errors: list[BaseException] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def running(self) -> bool:
        """True from `start` until `stop`."""
        return self._loop is not None

    @property
    def active(self) -> int:
        """Connections being relayed now."""
        return len(self._tasks)

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"relay-{self.listen[0]}", daemon=True
        )
        self._thread.start()
        try:
            self._server = self._call(
                asyncio.start_server(self._serve, *self.listen, reuse_address=True, backlog=1024)
            )
        except BaseException:
            self._halt()
            raise
        self.address = self._server.sockets[0].getsockname()[:2]

    def stop(self) -> None:
        """Stop listening and cut every open connection."""
        if self._loop is None:
            return
        try:
            self._call(self._close())
        finally:
            self._halt()

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def _halt(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._loop = None

    async def _close(self) -> None:
        self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.accepted += 1
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), self.connect_timeout
                )
            except (OSError, TimeoutError) as exc:  # the client sees its connection closed
                log.warning("relay cannot reach its target", target=self.target, error=str(exc))
                return
            try:
                await asyncio.gather(
                    self._pump(reader, up_writer, writer), self._pump(up_reader, writer, up_writer)
                )
            finally:
                up_writer.transport.abort()
        finally:
            writer.transport.abort()  # both directions are done or one side is gone

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, source_end: asyncio.StreamWriter
    ) -> None:
        """Copy until EOF, then half-close the sink; on a reset, cut both ends."""
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
            if not sink.is_closing():
                sink.write_eof()
        except OSError as exc:  # one peer is gone: the other direction must end too
            log.debug("relayed connection cut", error=repr(exc))
            sink.transport.abort()
            source_end.transport.abort()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("relay failed on a connection", error=repr(exc))
            self.errors.append(exc)


class NetnsCluster:
    """`n` network namespaces on one bridge, with a relay to the local broker.

    Use as a context manager; teardown (kill processes, delete veths, namespaces and bridge,
    stop the relay) always runs, also when the body raises.
    """

    def __init__(
        self,
        n: int,
        log_dir: Path | None = None,
        target: tuple[str, int] = (BROKER_HOST, BROKER_PORT),
    ) -> None:
        if not 1 <= n <= MAX_NODES:
            raise ValueError(f"n must be in 1..{MAX_NODES}, not {n}")
        self.n = n
        self.log_dir = log_dir
        self.target = target
        self.namespaces: tuple[str, ...] = ()
        """Namespace names, node i at index i."""
        self._k: int | None = None
        self._relay: Relay | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._logs: dict[int, tuple[Path, Path]] = {}

    @property
    def generation(self) -> int:
        """k: the bridge is agentrl-br<k> on 10.77.<k>.0/24."""
        assert self._k is not None, "the cluster is not running"
        return self._k

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the bridge, where the relay listens."""
        return f"10.77.{self.generation}.1"

    @property
    def broker_url(self) -> str:
        """The AMQP URL to use from inside the namespaces."""
        return f"amqp://guest:guest@{self.bridge_address}:{BROKER_PORT_IN_NS}/"

    @property
    def relay(self) -> Relay:
        assert self._relay is not None, "the cluster is not running"
        return self._relay

    def address(self, ns: str) -> str:
        """The IPv4 address of `ns` on the bridge."""
        return f"10.77.{self.generation}.{10 + self.namespaces.index(ns)}"

    def __enter__(self) -> NetnsCluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        errors = self._relay.errors if self._relay is not None else []
        self.close()
        if errors and exc_type is None:
            raise RelayFailed(f"relay failed on {len(errors)} connection(s)") from errors[0]

    def _build(self) -> None:
        k = self._k = _claim_generation()
        bridge = f"agentrl-br{k}"
        _ip(f"link add {bridge} type bridge")
        _ip(f"addr add {self.bridge_address}/24 dev {bridge}")
        _ip(f"link set {bridge} up")
        self.namespaces = tuple(f"agentrl-{os.getpid()}-{k}-n{i}" for i in range(self.n))
        for i, ns in enumerate(self.namespaces):
            _ip(f"netns add {ns}")
            _ip(f"link add agentrl{k}v{i} type veth peer name eth0 netns {ns}")
            _ip(f"link set agentrl{k}v{i} master {bridge} up")
            _ip(f"-n {ns} addr add {self.address(ns)}/24 dev eth0")
            _ip(f"-n {ns} link set eth0 up")
            _ip(f"-n {ns} link set lo up")
        self._relay = Relay((self.bridge_address, BROKER_PORT_IN_NS), self.target)
        self._relay.start()
        self._wait_forwarding(bridge)

    def _wait_forwarding(self, bridge: str, timeout: float = 10.0) -> None:
        """Wait until every bridge port is up and forwarding (carrier comes asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            ports = _ip_json(f"-d link show master {bridge}")
            states = [
                (p["operstate"], p["linkinfo"].get("info_slave_data", {}).get("state"))
                for p in ports
            ]
            if len(ports) == self.n and all(s == ("UP", "forwarding") for s in states):
                return
            if time.monotonic() > deadline:
                raise NetnsError(f"bridge {bridge} ports not forwarding: {states}")
            threading.Event().wait(0.01)

    def popen(self, ns: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `ip netns exec <ns> <argv>` in a new process group (killed at teardown).

        Keyword arguments go to `subprocess.Popen` (the environment is inherited unless `env`
        is given). With a `log_dir`, stdout and stderr not given go to files there; see
        `log_paths`.
        """
        if ns not in self.namespaces:
            raise ValueError(f"{ns!r} is not one of {self.namespaces}")
        opened = []
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            stem = self.log_dir / f"{len(self._procs):02d}-{ns}"
            for stream, suffix in (("stdout", ".out"), ("stderr", ".err")):
                if stream not in kw:
                    kw[stream] = open(stem.with_suffix(suffix), "wb")  # noqa: SIM115
                    opened.append(kw[stream])
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, *argv], start_new_session=True, **kw
            )
        finally:
            for file in opened:
                file.close()  # the child holds its own descriptor
        self._procs.append(proc)
        if opened:
            self._logs[proc.pid] = (stem.with_suffix(".out"), stem.with_suffix(".err"))
        return proc

    def log_paths(self, proc: subprocess.Popen[Any]) -> tuple[Path, Path]:
        """(stdout, stderr) files of a process started by `popen` with a `log_dir`."""
        return self._logs[proc.pid]

    def close(self) -> None:
        """Kill the processes, stop the relay, delete everything; idempotent."""
        errors: list[BaseException] = []
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # exited since poll()
                    os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired as exc:
                errors.append(exc)
        self._procs.clear()
        steps = [self._relay.stop] if self._relay is not None else []
        if self._k is not None:
            k = self._k
            steps += [lambda: _remove(*_generation(k)), (STATE_DIR / str(k)).unlink]
        for step in steps:
            try:
                step()
            except (OSError, NetnsError, subprocess.SubprocessError) as exc:
                errors.append(exc)
        self._relay = None
        self._k = None
        if errors:
            raise ExceptionGroup("netns teardown incomplete", errors)


@functools.cache
def _netns_problem() -> str | None:
    """Why namespaces, veths and bridges cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (euid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"agentrl-{os.getpid()}-probe"
    try:
        _ip(f"netns add {probe}")
        _ip(f"-n {probe} link add p0 type veth peer name p1")
        _ip(f"-n {probe} link add b0 type bridge")
    except NetnsError as exc:
        return f"cannot create a namespace with a veth pair and a bridge: {exc}"
    finally:
        if probe in _list_namespaces():
            _ip(f"netns del {probe}")
    return None


def require_netns() -> None:
    """Skip the test when namespaces cannot be made; fail instead if AGENTRL_REQUIRE_BROKER=1."""
    problem = _netns_problem()
    if problem is None:
        return
    if os.environ.get("AGENTRL_REQUIRE_BROKER") == "1":
        pytest.fail(f"{problem} and AGENTRL_REQUIRE_BROKER=1")
    pytest.skip(f"{problem} (set AGENTRL_REQUIRE_BROKER=1 to make this a failure)")


@contextlib.contextmanager
def namespaces(
    n: int, log_dir: Path | None = None, target: tuple[str, int] = (BROKER_HOST, BROKER_PORT)
) -> Iterator[NetnsCluster]:
    """`require_netns()`, then a running `NetnsCluster` of `n` namespaces."""
    require_netns()
    with NetnsCluster(n, log_dir, target) as cluster:
        yield cluster
