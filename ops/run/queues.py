"""A run's queues on its broker: probe one, clear what an earlier same-named run left,
and broadcast the shutdown that stops every node (`agentrl-supervisor stop`)."""

from __future__ import annotations

import structlog

from agentrl.messages import BrokerRefused, ControlCommand, Topology, Unroutable, connect, encode

log = structlog.get_logger(__name__)

__all__ = ["clear_leftovers", "queue_exists", "stop_run"]


def _depth(transport, queue: str) -> int | None:
    """The messages in ``queue``, None where the broker has no such queue (404)."""
    try:
        return transport.queue_depth(queue)
    except BrokerRefused:
        return None


def queue_exists(broker: str, queue: str, run: str) -> bool:
    """Whether ``queue`` is on ``broker`` (RabbitMQ keeps a run's queues across its
    processes; an in-process broker starts empty in each)."""
    transport = connect(broker, name=f"{run}-probe")
    try:
        return _depth(transport, queue) is not None
    finally:
        transport.close()


def clear_leftovers(broker: str, run: str) -> None:
    """Delete the episodes and trajectories queues an earlier run of the same name left
    (on RabbitMQ queues outlive their run; their messages belong to weights that no longer
    exist). For the first start of a run, by the node that holds its learner, before its
    roles start: a node of the run started before it would lose its consumers, so start
    the learner's node first when a run name is reused."""
    names = Topology(run)
    transport = connect(broker, name=f"{run}-setup")
    try:
        for queue in (names.episodes, names.trajectories):
            depth = _depth(transport, queue)
            if depth is None:  # no such queue, nothing left over
                continue
            if depth:
                log.warning("fresh run: leftover messages discarded", queue=queue, count=depth)
            transport.delete_queue(queue)
    finally:
        transport.close()


def stop_run(broker: str, run: str, reason: str) -> bool:
    """Ask every node of ``run`` to drain and exit; False when no node was listening."""
    transport = connect(broker, name=f"{run}-stop")
    try:
        body = encode(ControlCommand(command="shutdown", reason=reason), run=run)
        try:
            transport.publish(Topology(run).control, "command.shutdown", body).result(30)
        except Unroutable:
            return False
        return True
    finally:
        transport.close()
