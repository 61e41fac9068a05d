"""An agent written with the `openai` package only, trained by agentrl through its endpoint.

    agentrl-supervisor start --config examples/serve.yaml \
        --roles sampler,learner,serve --max-steps 4
    export AGENTRL_API_KEY=$(cat runs/serve/serve/api_key)   # the generated key
    python examples/openai_agent.py --base-url http://127.0.0.1:8000/v1 --episodes 64

Each episode: open it (``POST /episodes``: the task's opening messages and tools), then
the usual tool loop of chat completions, the episode's id in a header; the task's
environment answers each assistant turn (``POST /episodes/<id>/step``) and judges the
episode. The endpoint turns the calls into a trajectory with the exact sampled tokens, and
the run's learner trains on it. Nothing here imports agentrl.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import threading

import openai


def play(client: openai.OpenAI, task: str, max_turns: int) -> float:
    """One episode of ``task``: its reward."""
    episode = client.post("/episodes", body={"task": task}, cast_to=object)
    messages, tools = episode["messages"], episode["tools"]
    headers = {"X-Agentrl-Episode": episode["id"]}
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=tools, extra_headers=headers
        )
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        step = client.post(f"/episodes/{episode['id']}/step", body={}, cast_to=object)
        messages.extend(step["messages"])
        if step["finish"]:
            return step["reward"]
    end = {"status": "task_limit_reached"}  # give up: the environment judges, not the agent
    return client.post(f"/episodes/{episode['id']}/end", body=end, cast_to=object)["reward"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("AGENTRL_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        help="the endpoint's key (default $AGENTRL_API_KEY, else $OPENAI_API_KEY; without "
        "serve.api_key the run keeps a generated one in runs/<run>/serve/api_key)",
    )
    parser.add_argument("--task", default="calculator")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=8)
    args = parser.parse_args()
    if not args.api_key:
        parser.error("no API key: pass --api-key or set AGENTRL_API_KEY")
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=2)
    rewards: list[float] = []
    lock = threading.Lock()

    def one(_: int) -> None:
        reward = play(client, args.task, args.max_turns)
        with lock:
            rewards.append(reward)
            if len(rewards) % 8 == 0:
                recent = rewards[-8:]
                print(f"{len(rewards)} episodes, last 8: mean reward {sum(recent) / 8:+.2f}",
                      flush=True)  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        try:
            for future in concurrent.futures.as_completed(
                [pool.submit(one, i) for i in range(args.episodes)]
            ):
                future.result()
        except (openai.APIConnectionError, openai.NotFoundError) as exc:
            print(f"the endpoint went away ({type(exc).__name__}): the run has ended")
            pool.shutdown(cancel_futures=True)
    print(f"{len(rewards)} episodes played")


if __name__ == "__main__":
    main()
