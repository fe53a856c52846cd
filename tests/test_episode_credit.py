"""What a step does with each episode: `decide_episodes` (advantage, kept; infrastructure-failure
groups; TRL batch scaling), per-turn credit, and a real `GRPOTrainer.train_step` whose batch,
metrics and rollout records all read that one decision.

Expected values are hand computations (plain python, `statistics`), never the function under test.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.grpo.advantages import discounted_returns, turn_of_token, turn_token_advantages
from skyrl_tool_agent.grpo.batch import decide_episodes
from skyrl_tool_agent.grpo.rollout_log import rollout_records
from skyrl_tool_agent.grpo.trainer import GRPOTrainer
from skyrl_tool_agent.data.loader import build_loader
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory
from tests.fixtures.tiny_policy import tiny_policy
from tests.test_trainer_update import model_dir  # noqa: F401 - the shared tiny model fixture

# three groups of two: informative, an infrastructure failure, uniform
REWARDS = [1.0, 0.0, 0.5, 0.0, 0.2, 0.2]
DONE = ["answer", "answer", "answer", "error", "answer", "answer"]


def episode(task_id: str, member: int, reward: float, done: str = "answer", *,
            turn_rewards: Sequence[float] = (0.0, 1.0), vocab: int = 50) -> Trajectory:
    """An episode of two turns: prompt (4 ids), turn 0 (3 sampled), observation (2), turn 1 (2 sampled)."""
    mask = [0] * 4 + [1] * 3 + [0] * 2 + [1] * 2
    gen = torch.Generator().manual_seed(hash((task_id, member)) % 1000)
    ids = torch.randint(5, vocab, (len(mask),), generator=gen).tolist()
    result = EpisodeResult(task_id=task_id, db_id="shop", reward=reward, done_reason=done,
                           components={"execution": reward})
    return Trajectory(task_id, member, [], result, ids, mask, [0.0] * len(mask), list(turn_rewards))


def step_episodes(vocab: int = 50) -> list[Trajectory]:
    return [episode(f"t{i // 2}", i % 2, r, d, vocab=vocab) for i, (r, d) in enumerate(zip(REWARDS, DONE))]


def test_infra_error_groups_get_no_update_and_no_batch_statistics() -> None:
    decided = decide_episodes(step_episodes(), 2, estimator="dr_grpo", scale_batch=True)
    assert decided.kept == [True, True, False, False, False, False]
    assert decided.scored == [True, True, True, False, True, True]
    assert (decided.groups_dropped, decided.infra_groups) == (1, 1)
    # TRL scale_rewards="batch": centred in the group, over the std of the scored groups' rewards
    std = statistics.stdev([1.0, 0.0, 0.2, 0.2])
    assert decided.advantages == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0, 0.0, 0.0], rel=1e-5)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo"])
def test_batch_scaling_replaces_the_group_std(estimator: str) -> None:
    """Not the group-normalised advantages over their own std (which is ~1 whatever the rewards)."""
    rewards = [0.9, 0.1, 0.3, 0.1]  # group means differ: the std of rewards is not that of the centred ones
    trajectories = [episode(f"t{i // 2}", i % 2, r) for i, r in enumerate(rewards)]
    decided = decide_episodes(trajectories, 2, estimator=estimator, scale_batch=True)
    std = statistics.stdev(rewards)
    assert decided.advantages == pytest.approx([0.4 / std, -0.4 / std, 0.1 / std, -0.1 / std], rel=1e-5)


def test_turn_credit_by_hand() -> None:
    mask = torch.tensor([0, 0, 1, 1, 0, 1, 0, 0, 1, 1])
    assert turn_of_token(mask).tolist() == [-1, -1, 0, 0, -1, 1, -1, -1, 2, 2]
    assert discounted_returns(torch.tensor([-0.05, -0.05, 1.0]), 0.5).tolist() == pytest.approx(
        [-0.05 + 0.5 * -0.05 + 0.25 * 1.0, -0.05 + 0.5 * 1.0, 1.0])
    # turn rewards: shaping -0.05 on turn 0, 0 on turn 1, the final reward 1.0 (already in the outcome)
    per_id = turn_token_advantages(0.7, torch.tensor([-0.05, 0.0, 1.0]), mask, 0.5)
    turn0, turn1, turn2 = 0.7 - 0.05, 0.7, 0.7
    assert per_id.tolist() == pytest.approx([0, 0, turn0, turn0, 0, turn1, 0, 0, turn2, turn2])
    # turns that do not line up with the rewards: the outcome alone
    assert turn_token_advantages(0.7, torch.tensor([1.0]), mask, 0.5).tolist() == pytest.approx(
        [0, 0, 0.7, 0.7, 0, 0.7, 0, 0, 0.7, 0.7])


class PreparedEpisodes(GRPOTrainer):
    """A real trainer whose rollouts are the prepared episodes (the env is the only part left out)."""

    episodes: list[Trajectory] = []

    def collect(self, tasks, group_size, params, settings=None, on_episode_done=None):  # type: ignore[no-untyped-def]
        return list(self.episodes)


def test_train_step_batch_metrics_and_rollouts_read_one_decision(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    config = Config.model_validate({
        "model": {"name_or_path": str(model_dir), "device": "cpu"},
        "training": {"mode": "full", "tasks_per_step": 3, "wandb": {"mode": "disabled"}},
        "grpo": {"group_size": 2, "curriculum": {"mode": "uniform"}},
    })
    policy = tiny_policy(model_dir, mode="full")
    tasks = [Task(task_id=f"t{i}", db_id="shop", question="q", gold_sql="select 1", difficulty="easy") for i in range(3)]
    trainer = PreparedEpisodes(config, policy, None, build_loader(config, tasks), [], output_dir=tmp_path)  # type: ignore[arg-type]
    trainer.episodes = step_episodes(vocab=policy.model.config.vocab_size)

    out = trainer.train_step()

    scored = [r for r, d in zip(REWARDS, DONE) if d != "error"]
    assert out.metrics["reward/mean"] == pytest.approx(statistics.mean(scored))
    assert out.metrics["reward/execution"] == pytest.approx(statistics.mean(scored))  # the same denominator
    assert out.metrics["train/trajectories_used"] == 2
    assert (out.metrics["train/groups_dropped"], out.metrics["train/groups_infra_error"]) == (1, 1)
    assert out.metrics["train/optimizer_steps"] == 1
    records = rollout_records(1, out.tasks, out.trajectories, out.advantages, out.kept, 6)
    used = sorted((r["reward"], r["done_reason"]) for r in records if r["used_in_update"])
    assert used == [(0.0, "answer"), (1.0, "answer")]  # the informative group; never the infrastructure-error one
