"""Env workers under load: thousands of concurrent sessions, the controller's registry watching.

    python bench/env_controller.py [--workers 4] [--capacity 500] [--sessions 2000]
        [--steps 5] [--connections 4] [--interval 2] [--broker amqp://guest:guest@127.0.0.1:5672/]
    python bench/env_controller.py --smoke    # 1 worker, 20 sessions of 2 steps (CI; RabbitMQ)

``--workers`` `EnvWorker` processes serve a trivial ``echo`` task (registered
here: each interact echoes the message; the session finishes after
``--steps`` interacts). The driver process runs a `ControllerActor` and the
client side: ``--sessions`` sessions spread over ``--connections`` broker
connections, each session a chain of RPC callbacks on its connection's I/O
thread (no thread per session). The clients report their live sessions to the
controller like a rollout actor does (`SessionReport`, role ``rollout``), so the
registry can reconcile the two tables.

Phases: (0) one session alone, 50 steps: the unloaded step overhead; (1) all
sessions start at once; once the registry lists every one of them its view is
printed (peak); (2) every session runs its steps at once. Step overhead = round
trip of one interact (publish, worker, reply) minus the task's own time, which
the echo task reports in its reply. The machine's load average and the CPU time
used by the driver, the workers and RabbitMQ are printed with the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from agentrl.actors import ControllerActor, TaskEntry, TopologySpec
from agentrl.actors._env_registry import RegistryTimes
from agentrl.environments._protocol import Start, Status, Step
from agentrl.environments._remote import task_queue, worker_queue
from agentrl.messages import (
    ChatMessage,
    CheckpointReady,
    EnvInteract,
    EnvReply,
    EnvStart,
    SessionReport,
    Topology,
    connect,
    decode,
    encode,
)

TASK = "echo"


class EchoTask:
    """The lightest possible task: interact echoes; the session ends after ``steps`` interacts."""

    tools: list[dict] = []
    num_instances = 1_000_000

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def start(self, index: int) -> Start:
        return Start(session=[0], messages=[ChatMessage("user", f"echo #{index}")])

    def interact(self, session, message: ChatMessage) -> Step:
        t0 = time.perf_counter()
        session[0] += 1
        done = session[0] >= self.steps
        status = Status.COMPLETED if done else Status.RUNNING
        reply = [ChatMessage("user", message.content)]
        return Step(reply, status, 1.0 if done else 0.0, done,
                    {"env/task_seconds": time.perf_counter() - t0})  # fmt: skip

    def cancel(self, session) -> None:
        session[0] = self.steps


def serve_worker(args: argparse.Namespace) -> None:
    from agentrl.environments._worker import EnvWorker

    worker = EnvWorker(
        EchoTask(args.steps), broker=args.broker, run=args.run, task=TASK,
        capacity=args.capacity, worker_id=args.worker_id, heartbeat_interval=args.interval,
    )  # fmt: skip
    print("READY", flush=True)
    try:
        worker.serve_forever()
    finally:
        worker.close()


# --- the client side ---------------------------------------------------------------------


@dataclass
class Clients:
    """Sessions driven as callback chains; results gathered under a lock."""

    run: str
    transports: list
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[str, tuple[str, float]] = field(default_factory=dict)  # sid -> (worker, last)
    overheads: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finished: int = 0

    def start_session(self, i: int, then) -> None:
        transport = self.transports[i % len(self.transports)]
        sid = uuid.uuid4().hex
        body = encode(EnvStart(sid, TASK, i), run=self.run)

        def started(f) -> None:
            reply = self._reply(f, sid)
            if reply is not None:
                with self.lock:
                    self.live[sid] = (reply.worker_id, time.monotonic())
                then(transport, sid, reply.worker_id)

        transport.call("", task_queue(self.run, TASK), body, timeout=300).add_done_callback(started)

    def run_steps(self, transport, sid: str, worker: str, done) -> None:
        """Interact until the worker says finish; record each step's overhead."""
        sent = time.perf_counter()
        msg = ChatMessage("assistant", "ping")
        body = encode(EnvInteract(sid, msg), run=self.run)

        def answered(f) -> None:
            rtt = time.perf_counter() - sent
            reply = self._reply(f, sid)
            if reply is None:
                done()
                return
            with self.lock:
                self.overheads.append(rtt - reply.metrics.get("env/task_seconds", 0.0))
                if reply.finish:
                    self.live.pop(sid, None)
                    self.finished += 1
                else:
                    self.live[sid] = (worker, time.monotonic())
            if reply.finish:
                done()
            else:
                self.run_steps(transport, sid, worker, done)

        transport.call("", worker_queue(self.run, worker), body, timeout=300).add_done_callback(
            answered
        )

    def _reply(self, f, sid: str) -> EnvReply | None:
        if f.exception() is not None:
            with self.lock:
                self.errors.append(f"{sid}: {f.exception()!r}")
                self.live.pop(sid, None)
            return None
        return decode(f.result().body, expect=EnvReply).payload

    def report(self) -> SessionReport:
        now = time.monotonic()
        with self.lock:
            rows = list(self.live.items())
        return SessionReport(
            "bench-clients", "rollout", time.time(), "", len(rows),
            [s for s, _ in rows], [now - last for _, (_, last) in rows],
            [w for _, (w, _) in rows], [f"ep-{s}" for s, _ in rows], [TASK] * len(rows),
        )  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rabbit_pid() -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "beam.smp":
                    return int(pid)
        except OSError:
            continue
    return None


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        threading.Event().wait(0.05)


def drive(args: argparse.Namespace) -> None:
    run = f"benchenv-{uuid.uuid4().hex[:6]}"
    spec = TopologySpec(run, ("current",), 64)
    admin = connect(args.broker, name=f"{run}-admin")
    Topology(run).declare(admin, ["current"], 64)
    admin.declare_queue(task_queue(run, TASK))
    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}")
    rabbit = _rabbit_pid()
    rabbit_cpu0 = _cpu_seconds(rabbit) if rabbit else float("nan")
    cpu0, wall0 = time.process_time(), time.monotonic()
    procs = []
    for i in range(args.workers):
        argv = [sys.executable, __file__, "--serve-worker", "--broker", args.broker,
                "--run", run, "--worker-id", f"w{i}", "--capacity", str(args.capacity),
                "--steps", str(args.steps), "--interval", str(args.interval)]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        while proc.stdout.readline().strip() != "READY":
            pass
    ctl = ControllerActor.start(
        broker=args.broker, topology=spec, tasks={TASK: TaskEntry(1.0, 1)}, group_size=2,
        episodes_per_batch=2, max_staleness=0,
        initial=CheckpointReady(version=0, uri="/none", digest="", created_at=0.0),
        env_times=RegistryTimes.for_interval(args.interval), reconcile_interval=args.interval,
    ).proxy()  # fmt: skip
    clients = Clients(
        run, [connect(args.broker, name=f"{run}-c{i}") for i in range(args.connections)]
    )
    stop = threading.Event()

    def report_loop() -> None:
        control = Topology(run).control
        while not stop.wait(args.interval):
            admin.publish(control, "sessions.rollout", encode(clients.report(), run=run))

    threading.Thread(target=report_loop, daemon=True).start()
    try:
        # (0) unloaded: 10 sessions one after the other, nothing else running
        for k in range(10):
            one = threading.Event()
            clients.start_session(k, lambda t, sid, w, e=one: clients.run_steps(t, sid, w, e.set))
            if not one.wait(120):
                raise SystemExit("a lone session did not finish within 120 s")
        solo = list(clients.overheads)
        clients.overheads.clear()
        clients.finished = 0
        print(f"unloaded step overhead ({len(solo)} steps): p50 {pct(solo, 50) * 1e3:.2f} ms, "
              f"p99 {pct(solo, 99) * 1e3:.2f} ms")  # fmt: skip
        # (1) every session starts at once; none steps before all have started
        ready: list = []
        t_start = time.monotonic()
        for i in range(args.sessions):
            clients.start_session(i + 10, lambda t, sid, w: ready.append((t, sid, w)))
        wait_until(lambda: len(ready) + len(clients.errors) >= args.sessions, 600, "starts")
        t_started = time.monotonic()
        rate = len(ready) / (t_started - t_start)
        print(f"{len(ready)} sessions started in {t_started - t_start:.1f} s "
              f"({rate:.0f} starts/s), errors {len(clients.errors)}")  # fmt: skip
        wait_until(
            lambda: ctl.status().get().get("env_sessions/live", 0) >= len(ready)
            and ctl.status().get().get("env_sessions/claimed", 0) >= len(ready),
            10 * args.interval + 30, "the registry to list every session",
        )  # fmt: skip
        status = ctl.status().get()
        print("registry at peak:")
        for key in sorted(status):
            if key.startswith(("env_workers/", "env_sessions/", "env_worker/")):
                print(f"  {key} = {status[key]:g}")
        # (2) every session runs its steps at once
        left = threading.Semaphore(0)
        t_go = time.monotonic()
        for transport, sid, worker in ready:
            clients.run_steps(transport, sid, worker, left.release)
        for _ in ready:
            if not left.acquire(timeout=600):
                raise SystemExit("sessions did not finish within 600 s")
        t_end = time.monotonic()
        steps = clients.overheads
        print(f"{len(steps)} interacts by {len(ready)} concurrent sessions in {t_end - t_go:.1f} s "
              f"({len(steps) / (t_end - t_go):.0f} interacts/s)")  # fmt: skip
        print(f"loaded step overhead: p50 {pct(steps, 50) * 1e3:.1f} ms, "
              f"p99 {pct(steps, 99) * 1e3:.1f} ms")  # fmt: skip
        print(f"sessions/s (start to finish, {args.steps} steps each): "
              f"{clients.finished / (t_started - t_start + t_end - t_go):.0f} (the registry "
              f"wait excluded); finished {clients.finished}, "
              f"errors {len(clients.errors)}")  # fmt: skip
        wait_until(lambda: ctl.status().get().get("env_sessions/live", 1) == 0, 60, "drain")
        final = ctl.status().get()
        print(f"after: live {final['env_sessions/live']:g}, lost {final['env_sessions/lost']:g}, "
              f"orphans cancelled {final['env_sessions/orphans_cancelled']:g}")  # fmt: skip
    finally:
        stop.set()
        ctl.stop()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        wall = time.monotonic() - wall0
        children = os.times().children_user + os.times().children_system
        rabbit_cpu = (_cpu_seconds(rabbit) - rabbit_cpu0) if rabbit else float("nan")
        print(f"CPU seconds over {wall:.0f} s wall: driver {time.process_time() - cpu0:.1f}, "
              f"workers {children:.1f}, rabbitmq {rabbit_cpu:.1f}; "
              f"load average after: {os.getloadavg()}")  # fmt: skip
        for t in clients.transports:
            t.close()
        names = Topology(run)
        for q in (task_queue(run, TASK), names.episodes, names.trajectories, names.dead,
                  names.control_rpc, names.generate_queue("current")):  # fmt: skip
            admin.delete_queue(q)
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--interval", type=float, default=2.0, help="heartbeat/report seconds")
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument(
        "--smoke", action="store_true", help="1 worker, 20 sessions of 2 steps: checks it runs"
    )
    parser.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.workers, args.capacity, args.sessions, args.steps = 1, 40, 20, 2
        args.connections, args.interval = 1, 0.5
    if args.serve_worker:
        serve_worker(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
