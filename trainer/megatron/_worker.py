"""A worker rank (1..) of the Megatron learner: ``python -m agentrl.trainer.megatron._worker``.

Started by :func:`._launch.spawn_workers` with its :class:`MegatronSpec` (JSON)
and rank in the environment. It joins the process group, builds its shard and
runs rank 0's commands until ``stop``. It never talks to the broker. If the
process that started it goes away, it exits (a watchdog compares the parent
pid), so a killed learner leaves no orphan ranks behind.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import structlog

from ._launch import SPEC_ENV, MegatronSpec, init_process_group, receive_command
from ._rank import RankTrainer

log = structlog.get_logger(__name__)


def _watch_parent(parent: int, every: float = 1.0) -> None:
    """Exit this process as soon as its parent is gone."""
    while True:
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(every)


def main() -> int:
    spec = MegatronSpec.from_json(os.environ[SPEC_ENV])
    rank = int(os.environ["AGENTRL_MEGATRON_RANK"])
    parent = int(os.environ["AGENTRL_MEGATRON_PARENT"])
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    init_process_group(spec, rank)
    trainer = RankTrainer(spec)
    log.info("megatron_worker_ready", rank=rank, world=spec.world)
    while True:
        command = receive_command()
        if command.kind == "step":
            trainer.step(command.batch)
        elif command.kind == "save":
            trainer.save(command.path)
        elif command.kind == "stop":
            break
        else:
            raise ValueError(f"unknown command {command.kind!r} from rank 0")
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
