"""`TrajectoryCollector`: many multi-turn episodes at once, generation batched across them.

Each episode is an asyncio task looping `agent turn -> env.astep -> observation`; a `_GenerationBatcher`
hands the agent every request pending at once (up to `max_batch`) while other episodes' tool calls
run. Token ids are appended segment by segment, never re-tokenised.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.env import CollectorConfig
from skyrl_tool_agent.config.grpo import GRPOConfig
from skyrl_tool_agent.data.tasks import Task, task_user_message
from skyrl_tool_agent.env.chat_format import IM_END, render_conversation, render_observation
from skyrl_tool_agent.env.environment import MCPToolEnvironment
from skyrl_tool_agent.env.pools import EnvRuntime, EpisodeSetupError
from skyrl_tool_agent.mcp.pool import MCPPoolError
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.rewards.execution import DatabaseUnavailableError, GoldQueryError
from skyrl_tool_agent.rollout.agents import make_agent
from skyrl_tool_agent.rollout.turns import Agent, AgentTurn, TurnRequest, as_agent
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory

if TYPE_CHECKING:
    from skyrl_tool_agent.config import Config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectorSettings:
    """Episode limits and concurrency (mapped from GRPOConfig/EnvConfig by `from_config`). The
    defaults are the config's own (`CollectorSettings()` limits = `from_config(Config())`'s)."""

    max_turns: int = default_of(GRPOConfig, "max_turns")
    max_new_tokens_per_turn: int = default_of(GRPOConfig, "max_new_tokens_per_turn")
    max_total_tokens: int = default_of(GRPOConfig, "max_total_tokens")
    concurrency: int = default_of(CollectorConfig, "concurrency")
    max_batch: int = default_of(CollectorConfig, "concurrency")  # one generation batch holds every episode in flight
    max_episode_retries: int = default_of(CollectorConfig, "max_episode_retries")
    batch_wait_s: float = 0.002
    # True: each generation batch waits for every running episode (lockstep turns) and is ordered
    # by episode, so sampling does not depend on tool latency (reproducible runs and resumes).
    deterministic: bool = False
    # DISTINCT semantics of the execution match for these episodes; None = the runtime's reward
    # setting. Evaluations set it from env.reward.eval_keep_distinct.
    keep_distinct: bool | None = None

    @classmethod
    def from_config(cls, config: Config, *, max_turns: int | None = None, min_turns: int = 0,
                    concurrency: int | None = None, deterministic: bool | None = None,
                    evaluation: bool = False) -> CollectorSettings:
        """The one translation from config: limits from `grpo.*`, concurrency and retries from
        `env.collector`; `deterministic` (default `lockstep`) orders generation batches by episode,
        so results do not depend on tool latency. `evaluation`: scored with eval_keep_distinct."""
        g = config.grpo
        width = max(1, concurrency or config.env.collector.concurrency)
        return cls(
            max_turns=max(max_turns or g.max_turns, min_turns),
            max_new_tokens_per_turn=g.max_new_tokens_per_turn,
            max_total_tokens=g.max_total_tokens,
            concurrency=width,
            max_batch=width,
            max_episode_retries=config.env.collector.max_episode_retries,
            deterministic=config.env.collector.lockstep if deterministic is None else deterministic,
            keep_distinct=config.env.reward.eval_keep_distinct if evaluation else None,
        )


class _GenerationBatcher:
    """Collects turn requests from concurrent episodes and serves them in batches."""

    def __init__(self, agent: Agent, max_batch: int, wait_s: float, deterministic: bool = False) -> None:
        self.agent = agent
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.deterministic = deterministic
        self.pending: list[tuple[TurnRequest, asyncio.Future[AgentTurn]]] = []
        self.active_episodes = 0
        self._wakeup = asyncio.Event()
        self.batches = 0
        self.batched_requests = 0

    async def submit(self, request: TurnRequest) -> AgentTurn:
        future: asyncio.Future[AgentTurn] = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        self._wakeup.set()
        return await future

    async def run(self) -> None:
        # A continuous agent (the rollout engine) batches on its own: every request goes to it at once
        # and resolves alone. Lockstep collections still hand it whole batches, so which rows share
        # a decode step (and so any float rounding) never depends on tool latency.
        continuous = self.agent.continuous and not self.deterministic
        in_flight: set[asyncio.Task] = set()
        try:
            await self._serve(continuous, in_flight)
        finally:
            for task in in_flight:
                task.cancel()

    async def _serve(self, continuous: bool, in_flight: set[asyncio.Task]) -> None:
        while True:
            await self._wakeup.wait()
            # Give episodes that are finishing a tool call a moment to join this batch.
            deadline = math.inf if self.deterministic else time.monotonic() + self.wait_s
            while (not continuous and len(self.pending) < min(self.active_episodes, self.max_batch)
                   and time.monotonic() < deadline):
                await asyncio.sleep(0 if self.deterministic else 0.0002)
            if self.deterministic:
                self.pending.sort(key=lambda item: item[0].seq)
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
            if not self.pending:
                self._wakeup.clear()
            if not batch:
                continue
            self.batches += 1
            self.batched_requests += len(batch)
            if continuous:  # each request on its own: its episode goes on as soon as its own turn is done
                for item in batch:
                    task = asyncio.create_task(self._answer([item]))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
            else:
                await self._answer(batch)

    async def _answer(self, batch: list[tuple[TurnRequest, asyncio.Future[AgentTurn]]]) -> None:
        try:
            turns = await self.agent.act([r for r, _ in batch])
        except Exception as exc:  # noqa: BLE001 - fail these episodes, keep collecting
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), turn in zip(batch, turns):
            if not future.done():
                future.set_result(turn)


class TrajectoryCollector:
    """Runs episodes for tasks (G per task) through `MCPToolEnvironment` and an `Agent`;
    `tokenizer` records token ids/masks (None: text only)."""

    def __init__(self, runtime: EnvRuntime, agent: Agent, *, tokenizer: Any = None, settings: CollectorSettings | None = None) -> None:
        self.runtime = runtime
        self.agent = as_agent(agent)
        self.tokenizer = tokenizer
        self.settings = settings or CollectorSettings()
        self.last_stats: dict[str, float] = {}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def collect(
        self,
        tasks: Sequence[Task],
        group_size: int = 1,
        *,
        on_episode_done: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run `group_size` episodes per task; returns trajectories ordered by (task, group index)."""
        # E.g. the rollout engine: a KV-cache slot per episode in flight (as many as fit; the others wait).
        in_flight = min(self.settings.concurrency, len(tasks) * group_size)
        self.agent.start_collection(concurrency=max(1, in_flight), max_total_tokens=self.settings.max_total_tokens)
        batcher = _GenerationBatcher(
            self.agent, self.settings.max_batch, self.settings.batch_wait_s, self.settings.deterministic
        )
        runner = asyncio.create_task(batcher.run())
        semaphore = asyncio.Semaphore(self.settings.concurrency)
        start = time.monotonic()

        async def one(seq: int, task: Task, index: int) -> Trajectory:
            async with semaphore:
                batcher.active_episodes += 1
                try:
                    traj = await self._episode_with_retries(task, index, batcher, seq)
                finally:
                    batcher.active_episodes -= 1
                    self.agent.end_episode(seq)  # an agent holding per-episode state (a KV cache) frees it
                if on_episode_done is not None:
                    on_episode_done(traj)
                return traj

        try:
            jobs = [one(k, task, g) for k, (task, g) in enumerate((t, g) for t in tasks for g in range(group_size))]
            trajectories = list(await asyncio.gather(*jobs))
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            self.agent.finish_collection()
        elapsed = time.monotonic() - start
        steps = sum(t.result.turns for t in trajectories)
        self.last_stats = {
            "episodes": float(len(trajectories)),
            "env_steps": float(steps),
            "seconds": elapsed,
            "env_steps_per_s": steps / elapsed if elapsed > 0 else 0.0,
            "mean_generation_batch": batcher.batched_requests / max(batcher.batches, 1),
        }
        return trajectories

    async def _episode_with_retries(self, task: Task, index: int, batcher: _GenerationBatcher, seq: int) -> Trajectory:
        """A crashed MCP server or an unreadable database fails only the episodes it was serving;
        they are retried here (DatabaseUnavailableError before its base class GoldQueryError)."""
        attempt = 0
        while True:
            try:
                traj = await self._episode(task, index, batcher, seq)
                traj.result.retries = attempt
                return traj
            except (MCPPoolError, DatabaseUnavailableError) as exc:
                # Infrastructure (a server that died or hung, a database that cannot be read): the
                # episode is retried, then reported with done_reason "error" -- never scored 0.
                attempt += 1
                if attempt > self.settings.max_episode_retries:
                    logger.warning("episode %s/%d failed after %d retries: %s", task.task_id, index, attempt - 1, exc)
                    result = EpisodeResult(task.task_id, task.db_id, done_reason="error", error=str(exc), retries=attempt - 1)
                    return Trajectory(task.task_id, index, [], result)
                logger.info("retrying episode %s/%d after an infrastructure failure: %s", task.task_id, index, exc)
            except GoldQueryError as exc:  # a dataset bug: report the episode, keep collecting
                logger.warning("episode %s/%d not scored: %s", task.task_id, index, exc)
                result = EpisodeResult(task.task_id, task.db_id, done_reason="error", error=f"gold SQL failed: {exc}")
                return Trajectory(task.task_id, index, [], result)
            except EpisodeSetupError as exc:
                logger.warning("episode %s/%d not started: %s", task.task_id, index, exc)
                result = EpisodeResult(task.task_id, task.db_id, done_reason="error", error=str(exc))
                return Trajectory(task.task_id, index, [], result)

    async def _episode(self, task: Task, index: int, batcher: _GenerationBatcher, seq: int) -> Trajectory:
        s = self.settings
        env = MCPToolEnvironment.for_task(task, self.runtime, max_turns=s.max_turns, keep_distinct=s.keep_distinct)
        try:
            return await self._play(env, task, index, batcher, seq)
        finally:
            await env.aclose()  # the episode's own servers (a server that writes) end with it

    async def _play(self, env: MCPToolEnvironment, task: Task, index: int, batcher: _GenerationBatcher,
                    seq: int) -> Trajectory:
        s = self.settings
        messages, env_info = env.init([task_user_message(task.db_id, task.question)])
        record = self.tokenizer is not None
        traj = Trajectory(task.task_id, index, list(messages), EpisodeResult(task.task_id, task.db_id))
        if record:
            prompt_ids = self._encode(render_conversation(messages))
            traj.token_ids, traj.loss_mask = list(prompt_ids), [0] * len(prompt_ids)
            traj.sampling_logprobs = [0.0] * len(prompt_ids)
            traj.prompt_length = len(prompt_ids)
        metadata: dict[str, Any] = {}
        done_reason = None
        for turn in range(s.max_turns):
            budget = s.max_total_tokens - len(traj.token_ids)
            if record and budget <= 0:
                done_reason = "max_tokens"
                break
            request = TurnRequest(task, index, traj.messages, traj.token_ids if record else None,
                                  min(s.max_new_tokens_per_turn, budget) if record else s.max_new_tokens_per_turn, turn, seq,
                                  env_info)
            reply = await batcher.submit(request)
            if reply.meta:  # e.g. a served model's HTTP error for this turn
                traj.agent_meta.append({"turn": turn, **reply.meta})
            if reply.infra_error is not None:  # no turn to play: unscored, never a wrong answer
                logger.warning("episode %s/%d not scored: %s", task.task_id, index, reply.infra_error)
                traj.result = self._result(task, env, {"done_reason": "error"}, error=reply.infra_error)
                return traj
            if record:
                end = [self.tokenizer.convert_tokens_to_ids(IM_END)]
                ids = reply.token_ids if reply.token_ids is not None else self._encode(reply.text) + end
                logps = reply.logprobs if reply.logprobs is not None else [0.0] * len(ids)
                traj.token_ids += ids
                traj.loss_mask += [1] * len(ids)
                traj.sampling_logprobs += list(logps)
            out = await env.astep(reply.text)
            traj.messages = list(env.chat_history)
            traj.turn_rewards.append(float(out["reward"]))
            metadata = out["metadata"]
            if out["done"]:
                break
            if record:
                obs_ids = self._encode(render_observation(out["observations"]))
                traj.token_ids += obs_ids
                traj.loss_mask += [0] * len(obs_ids)
                traj.sampling_logprobs += [0.0] * len(obs_ids)
        if not env.done:  # ended by the token budget: score what we have (no answer)
            env.reward = await asyncio.to_thread(env.score)
            done_reason = done_reason or "max_tokens"
            metadata = {"done_reason": done_reason, "reward_components": dict(env.reward.terms), **env.get_metrics()}
            if traj.turn_rewards:
                traj.turn_rewards[-1] = env.reward.total
        traj.result = self._result(task, env, metadata)
        return traj

    @staticmethod
    def _result(task: Task, env: MCPToolEnvironment, metadata: dict[str, Any],
                error: str | None = None) -> EpisodeResult:
        reward = env.reward
        return EpisodeResult(
            task_id=task.task_id,
            db_id=task.db_id,
            reward=reward.total if reward else 0.0,
            components=dict(reward.terms) if reward else {},
            solved=bool(reward and reward.solved),
            turns=env.turns,
            tool_calls=env.tool_calls,
            tool_errors=env.tool_errors,
            format_errors=env.format_errors,
            done_reason=metadata.get("done_reason", "max_turns"),
            final_sql=env.final_sql,
            last_query=env.last_query,
            error=error,
        )


class Collect(Protocol):
    """Runs `group_size` episodes per task and returns them in (task, group index) order: the
    signature of `GRPOTrainer.collect`, whose data-parallel subclass shards the tasks over ranks."""

    def __call__(self, tasks: Sequence[Task], group_size: int, params: SamplingParams,
                 settings: CollectorSettings | None = None,
                 on_episode_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]: ...


def collect_episodes(policy: Any, runtime: EnvRuntime, tasks: Sequence[Task], group_size: int,
                     params: SamplingParams, settings: CollectorSettings | None = None,
                     on_episode_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Episodes of `policy` (anything `make_agent` takes) in one collector call: what an evaluation
    runs when no trainer passes its own `collect`. An agent with a tokenizer records token ids."""
    agent = make_agent(policy, params)
    collector = TrajectoryCollector(runtime, agent, tokenizer=agent.tokenizer, settings=settings)
    return asyncio.run(collector.collect(tasks, group_size, on_episode_done=on_episode_done))
