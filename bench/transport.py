"""The broker's cost: agentrl's AMQP transport against raw pika, and what durability costs.

    python bench/transport.py [--messages 5000] [--size 10240] [--broker URL]
    python bench/transport.py --smoke    # 300 messages: seconds (CI)

Publishes ``--messages`` bodies of ``--size`` bytes (a trajectory is ~10 KB) to one queue
with publisher confirms, many in flight, and waits for every confirm; then drains the
queue. Three publishers, each on a fresh queue of the same kind it measures:

- ``raw pika``: a pika ``SelectConnection`` with confirms, publishing as fast as the
  channel takes it (the floor any transport on pika pays), transient messages;
- ``agentrl transient``: `AmqpTransport` with ``persistent=False`` to a non-durable queue
  (the same work as raw pika, through agentrl's publisher: ordering, confirms, retries);
- ``agentrl durable``: the default, a durable queue and persistent messages (what a run
  uses since its topology survives broker restarts).

It prints messages/s per publisher, the ratio agentrl transient / raw pika (the
transport's overhead; goal >= 0.8) and agentrl durable / agentrl transient (the cost of
durability), and the per-turn round trip: p50/p90 of an RPC (``call`` + ``reply``) through
the broker with a small body, the path a rollout's generate request takes.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from concurrent.futures import wait

import pika

from agentrl.messages._amqp import AmqpTransport
from agentrl.ops.logs.configure import configure_logging

URL = "amqp://guest:guest@127.0.0.1:5672/"


def raw_pika(url: str, queue: str, body: bytes, count: int) -> float:
    """Seconds to publish ``count`` bodies with confirms on a pika SelectConnection."""
    state = {"sent": 0, "acked": 0, "start": 0.0, "end": 0.0}
    done = threading.Event()

    def on_open(connection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel) -> None:
        def declared(_frame) -> None:
            channel.confirm_delivery(on_confirm, callback=lambda _: publish_all(channel))

        channel.queue_declare(queue, durable=False, callback=declared)

    def publish_all(channel) -> None:
        state["start"] = time.perf_counter()
        for _ in range(count):
            channel.basic_publish("", queue, body)
            state["sent"] += 1

    def on_confirm(frame) -> None:
        method = frame.method
        acked = method.delivery_tag if method.multiple else state["acked"] + 1
        state["acked"] = max(state["acked"], acked)
        if state["acked"] >= count:
            state["end"] = time.perf_counter()
            done.set()
            connection.close()

    connection = pika.SelectConnection(
        pika.URLParameters(url),
        on_open_callback=on_open,
        on_close_callback=lambda *_: connection.ioloop.stop(),
    )
    thread = threading.Thread(target=connection.ioloop.start, daemon=True)
    thread.start()
    if not done.wait(600):
        raise SystemExit("raw pika: not every publish was confirmed in 600 s")
    thread.join(30)
    return state["end"] - state["start"]


def agentrl(url: str, queue: str, body: bytes, count: int, *, durable: bool) -> float:
    """Seconds to publish ``count`` bodies through AmqpTransport and have every confirm."""
    transport = AmqpTransport(url, name=f"bench-{queue}", persistent=durable)
    try:
        transport.declare_queue(queue, durable=durable, dead_letter=False)
        start = time.perf_counter()
        futures = [transport.publish("", queue, body) for _ in range(count)]
        finished, pending = wait(futures, timeout=600)
        if pending:
            raise SystemExit(f"agentrl: {len(pending)} publishes unconfirmed after 600 s")
        for future in finished:
            future.result()
        return time.perf_counter() - start
    finally:
        transport.close()


def round_trips(url: str, queue: str, count: int) -> list[float]:
    """Seconds per RPC through the broker (a 200-byte request, a 200-byte reply)."""
    server = AmqpTransport(url, name="bench-rpc-server")
    client = AmqpTransport(url, name="bench-rpc-client")
    try:
        server.declare_queue(queue, dead_letter=False)
        server.consume(queue, lambda d: (server.reply(d, b"r" * 200), d.ack()), prefetch=10)
        client.call("", queue, b"warm", timeout=10).result(10)
        times = []
        for _ in range(count):
            start = time.perf_counter()
            client.call("", queue, b"q" * 200, timeout=10).result(10)
            times.append(time.perf_counter() - start)
        return times
    finally:
        client.close()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--size", type=int, default=10240, help="body bytes (a trajectory)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per publisher (median)")
    parser.add_argument("--rpcs", type=int, default=500, help="round trips to time")
    parser.add_argument("--broker", default=URL)
    parser.add_argument("--smoke", action="store_true", help="300 messages, 1 round, 50 RPCs")
    args = parser.parse_args()
    configure_logging("warning")
    if args.smoke:
        args.messages, args.rounds, args.rpcs = 300, 1, 50
    body = b"x" * args.size
    prefix = f"bench-transport-{uuid.uuid4().hex[:6]}"
    admin = AmqpTransport(args.broker, name="bench-admin")
    made: list[str] = []

    def fresh(kind: str, i: int) -> str:
        made.append(f"{prefix}.{kind}.{i}")
        return made[-1]

    rates: dict[str, list[float]] = {"raw pika": [], "agentrl transient": [], "agentrl durable": []}
    try:
        for i in range(args.rounds):  # interleaved, so drift hits every publisher alike
            seconds = raw_pika(args.broker, fresh("raw", i), body, args.messages)
            rates["raw pika"].append(args.messages / seconds)
            seconds = agentrl(args.broker, fresh("tr", i), body, args.messages, durable=False)
            rates["agentrl transient"].append(args.messages / seconds)
            seconds = agentrl(args.broker, fresh("du", i), body, args.messages, durable=True)
            rates["agentrl durable"].append(args.messages / seconds)
            for queue in made:  # dropped between rounds: the broker holds no backlog
                admin.delete_queue(queue)
            made.clear()
        rtt = round_trips(args.broker, fresh("rpc", 0), args.rpcs)
    finally:
        for queue in made:
            admin.delete_queue(queue)
        admin.close()
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"{args.messages} messages of {args.size} bytes, confirms, median of {args.rounds}:")
    for name, value in median.items():
        print(f"  {name:<18} {value:8.0f} msg/s  {value * args.size / 1e6:6.1f} MB/s")
    transport = median["agentrl transient"] / median["raw pika"]
    durable = median["agentrl durable"] / median["agentrl transient"]
    print(f"ratio agentrl transient / raw pika: {transport:.2f} (goal >= 0.8)")
    print(f"ratio agentrl durable / agentrl transient: {durable:.2f} (the cost of durability)")
    rtt.sort()
    p50, p90 = rtt[len(rtt) // 2], rtt[int(len(rtt) * 0.9)]
    print(f"round trip through the broker ({len(rtt)} RPCs): p50 {p50 * 1e3:.2f} ms, "
          f"p90 {p90 * 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
