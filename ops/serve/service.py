"""The endpoint's side of a run: sampling through the sampler pools, episodes, publishing.

`ServeService` connects to the run's broker like a rollout does: a completion is a
`GenerateRequest` RPC to a sampler pool (chosen by the pools' weights), and a finished
served episode is a `Trajectory` on the learner's queue, under the same staleness rules as
agentrl's own rollouts (the learner drops groups older than ``staleness.hard``; served
episodes are not admitted by the controller's window). It follows the checkpoints fanout
for the current version, appends every served group to the ledger
(``ledger/served.jsonl``), and ends the episodes whose agent went quiet for
``serve.episode_timeout`` seconds.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from agentrl.actors import TopologySpec, declare, subscribe
from agentrl.actors._ledger import LEDGER_DIR, SERVED_FILE, append_lines
from agentrl.environments import ChatFormat, make_task
from agentrl.messages import (
    ChatMessage,
    CheckpointReady,
    Delivery,
    GenerateRequest,
    GenerateResult,
    MessageError,
    Topology,
    Trajectory,
    connect,
    decode,
    encode,
)

from ..config.schema import RunConfig
from .episodes import EpisodeBook, EpisodeError, ServedEpisode, ServedGroup, read_assistant

log = structlog.get_logger(__name__)

__all__ = ["Completion", "ServeService"]


@dataclass(frozen=True)
class Completion:
    """One sampled choice: the result as sampled (after a stop string, cut), its message."""

    result: GenerateResult
    message: ChatMessage
    text: str
    finish_reason: str


class ServeService:
    """Completions and served episodes of one run (see the module doc)."""

    def __init__(
        self,
        cfg: RunConfig,
        tokenizer,
        *,
        version: int,
        node: str,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> None:
        """``on_episode``: called with each finished served episode's trajectory once the
        broker has it (the progress line's tally)."""
        self.cfg = cfg
        self._on_episode = on_episode
        self.model = cfg.model
        self._tok = tokenizer
        self.fmt = ChatFormat(tokenizer)
        self._version = version
        self._rng = random.Random(cfg.seed)
        self._rng_lock = threading.Lock()
        self._names = Topology(cfg.run)
        self._pools = {name: p.weight for name, p in cfg.pools.items() if p.weight > 0}
        self._served = cfg.run_dir / LEDGER_DIR / SERVED_FILE
        envs = {
            name: make_task(t.factory(name), **t.options)
            for name, t in cfg.tasks.items()
            if not t.remote
        }
        self.transport = connect(cfg.broker, name=f"{cfg.run}-{node}-serve")
        spec = TopologySpec(
            run=cfg.run,
            pools=tuple(cfg.pools),
            trajectory_capacity=cfg.episodes_per_batch * (cfg.staleness.max + 2),
        )
        declare(self.transport, spec)
        subscribe(self.transport, self._names.checkpoints, self._on_checkpoint)
        self.book = EpisodeBook(
            self.fmt,
            envs=envs,
            group_size=cfg.rollout.group_size,
            penalty=cfg.rollout.penalty,
            publish=self._publish,
            version=lambda: self._version,
            on_group=self._journal_group,
            seed=cfg.seed,
            judged=frozenset(cfg.tasks),
            reward_range=(cfg.serve.reward_range[0], cfg.serve.reward_range[1]),
        )
        self._stop = threading.Event()
        self._janitor = threading.Thread(target=self._expire, name="serve-expire", daemon=True)
        self._janitor.start()

    # --- the broker -------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def _on_checkpoint(self, delivery: Delivery) -> None:
        try:
            ready = decode(delivery.body, expect=CheckpointReady).payload
        except MessageError as exc:
            log.warning("malformed message dead-lettered", queue=delivery.queue, reason=str(exc))
            delivery.dead_letter(str(exc))
            return
        self._version = max(self._version, ready.version)
        delivery.ack()

    def _publish(self, traj: Trajectory) -> None:
        body = encode(traj, run=self.cfg.run)
        self.transport.publish("", self._names.trajectories, body).result()
        if self._on_episode is not None:
            self._on_episode(traj)
        log.info("served episode ended", episode=traj.episode_id, task=traj.task,
                 status=traj.status, reward=traj.reward, turns=traj.num_turns)  # fmt: skip

    def _journal_group(self, group: ServedGroup) -> None:
        entry = {"group": group.id, "task": group.task, "index": group.index,
                 "episodes": group.size, "version": group.version}  # fmt: skip
        append_lines(self._served, [entry])

    def _expire(self) -> None:
        timeout = self.cfg.serve.episode_timeout
        while not self._stop.wait(min(5.0, timeout / 4)):
            for traj in self.book.expire(timeout):
                log.warning("served episode abandoned by its agent", episode=traj.episode_id,
                            idle_s=timeout)  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        self.transport.close()

    # --- completions ------------------------------------------------------------------

    def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict],
        *,
        episode: ServedEpisode | None,
        n: int,
        temperature: float | None,
        top_p: float | None,
        max_tokens: int | None,
        stop: Sequence[str],
        parse_calls: bool,
    ) -> tuple[list[int], list[Completion]]:
        """The prompt ids and ``n`` sampled choices for one chat-completion request."""
        r = self.cfg.rollout
        if episode is not None:
            if n != 1:
                raise EpisodeError("n must be 1 inside an episode (open one episode per sample)")
            prompt = self.book.prompt(episode, messages, tools)
        else:
            prompt = self.fmt.prompt_ids(messages, tools)
        room = r.max_tokens - len(prompt)
        if room < 1:
            raise EpisodeError(
                f"the prompt is {len(prompt)} tokens; the run's context is {r.max_tokens} "
                "(rollout.max_tokens)"
            )
        max_new = min(max_tokens or r.max_new_tokens, room)
        temperature = r.temperature if temperature is None else temperature
        top_p = r.top_p if top_p is None else top_p
        if episode is not None:
            episode.in_call = True
        try:
            calls = [
                self._call(prompt, max_new, temperature, top_p, episode.id if episode else "")
                for _ in range(n)
            ]
            out = []
            for future, request in calls:
                reply = future.result(timeout=r.generate_timeout + 5)
                result = decode(reply.body, expect=GenerateResult).payload
                if result.request_id != request.request_id:
                    raise RuntimeError(f"reply for {result.request_id}, not {request.request_id}")
                out.append(self._choice(result, stop, parse_calls, episode))
        finally:
            if episode is not None:
                episode.in_call = False
                episode.last_active = time.monotonic()
        return prompt, out

    def _call(self, prompt: list[int], max_new: int, temperature: float, top_p: float, eid: str):
        with self._rng_lock:
            names, weights = zip(*self._pools.items(), strict=True)
            pool = self._rng.choices(names, weights)[0]
        request = GenerateRequest(
            request_id=uuid.uuid4().hex,
            episode_id=eid or "served",
            prompt_ids=prompt,
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            stop_ids=list(self.fmt.stop_ids),
        )
        body = encode(request, run=self.cfg.run)
        future = self.transport.call(
            self._names.generate, pool, body, timeout=self.cfg.rollout.generate_timeout
        )
        return future, request

    def _choice(
        self,
        result: GenerateResult,
        stop: Sequence[str],
        parse_calls: bool,
        episode: ServedEpisode | None,
    ) -> Completion:
        finish = result.finish_reason
        if stop:
            result, cut = _cut_at_stop(self.fmt, result, stop)
            finish = "stop" if cut else finish
        text = self.fmt.decode_assistant(result.token_ids)
        if stop:
            text = _before_stop(text, stop)
        if parse_calls:
            message, malformed = read_assistant(text)
        else:
            message, malformed = ChatMessage(role="assistant", content=text.strip()), False
        if episode is not None:  # the turn as returned, so the agent's echo of it matches
            self.book.sampled(episode, result, message, malformed)
        if message.tool_calls and finish == "stop":
            finish = "tool_calls"
        return Completion(result, message, text, finish)


def _before_stop(text: str, stop: Sequence[str]) -> str:
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


def _cut_at_stop(
    fmt: ChatFormat, result: GenerateResult, stop: Sequence[str]
) -> tuple[GenerateResult, bool]:
    """The result up to the token that completes the first stop string (the tokens after
    it were sampled but are not part of the answer, so they are not kept either)."""
    ids = result.token_ids
    for k in range(1, len(ids) + 1):
        if any(s and s in fmt.decode_assistant(ids[:k]) for s in stop):
            cut = GenerateResult(
                request_id=result.request_id,
                token_ids=ids[:k],
                logprobs=result.logprobs[:k],
                version=result.version,
                pool=result.pool,
                finish_reason="stop",
            )
            return cut, True
    return result, False
