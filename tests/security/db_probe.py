"""Plays SQL statements as a model would, in a process of its own, and reports what each
cost: ``python -m tests.security.db_probe '<json>'`` with ``{"options": {...}, "index": i,
"statements": [...], "answer": [...]}``; prints one JSON object: per statement its
observation, seconds and the process's peak RSS before and after (KiB), then the reward
of committing ``answer``. A process of its own so that the peak RSS is the attack's."""

from __future__ import annotations

import json
import resource
import sys
import time

from agentrl.environments import make_task
from agentrl.messages import ChatMessage, ToolCall


def _call(name: str, **arguments) -> ChatMessage:
    call = ToolCall(id="c", name=name, arguments=json.dumps(arguments))
    return ChatMessage("assistant", "", [call])


def main(spec: dict) -> dict:
    env = make_task("db", **spec.get("options", {}))
    session = env.start(spec.get("index", 0)).session
    played = []
    for sql in spec["statements"]:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.monotonic()
        step = env.interact(session, _call("execute_sql", query=sql))
        played.append({
            "sql": sql[:200],
            "observation": step.messages[0].content,
            "status": step.status.value,
            "seconds": time.monotonic() - start,
            "rss_before_kib": before,
            "rss_after_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        })  # fmt: skip
    final = env.interact(session, _call("commit_final_answer", answers=spec.get("answer", ["x"])))
    return {"played": played, "reward": final.reward, "status": final.status.value}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
