"""Every knob of the config schema, flipped: the documented change must happen through the code that
reads the knob (the trainer's update and loop on a real tiny Qwen2, the loader, the advantage and
collector settings, the path resolvers).

`FLIPS` maps a knob to a check (the update and model ones in tests/fixtures/update_flips.py);
`NOT_FLIPPED` lists, with the reason, each knob this file cannot flip. A knob in the schema in
neither fails `test_every_knob_is_flipped_or_excused`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.grpo.trainer import GRPOTrainer
from skyrl_tool_agent.eval.metrics import eval_metrics
from skyrl_tool_agent.grpo.run_logging import RunLogger, read_metrics
from skyrl_tool_agent.eval.splits import TaskSplits
from skyrl_tool_agent.data.loader import build_loader
from skyrl_tool_agent.rollout.collector import CollectorSettings
from tests.fixtures.knob_kit import TASKS, Kit, all_knobs, decided, lrs
from tests.test_episode_credit import PreparedEpisodes
from tests.test_train_pool import splits_of
from tests.fixtures.update_flips import (
    flip_adam_betas,
    flip_adam_eps,
    flip_attn_implementation,
    flip_clip_eps,
    flip_dtype,
    flip_entropy_coef,
    flip_fixed_length_normalizer,
    flip_gradient_accumulation,
    flip_gradient_checkpointing,
    flip_kl,
    flip_learning_rate,
    flip_lora_alpha,
    flip_lora_dropout,
    flip_lora_r,
    flip_lora_target_modules,
    flip_loss_aggregation,
    flip_lr_scheduler,
    flip_max_grad_norm,
    flip_micro_batch_size,
    flip_micro_batch_tokens,
    flip_mode,
    flip_temperature,
    flip_update_epochs,
    flip_warmup_steps,
    flip_weight_decay,
)
from tests.test_episode_credit import episode
from tests.test_trainer_update import model_dir  # noqa: F401 - the shared tiny model fixture

NOT_FLIPPED: dict[str, str] = {
    "model.device": "one device kind on a CPU test machine (auto and cpu both give cpu)",
    "model.revision": "a hub revision needs the network",
    "model.trust_remote_code": "needs a hub model with custom code (network)",
    "model.quantization.load_in_4bit": "bitsandbytes 4-bit; tests/test_qlora.py runs it where the kernels exist",
    "model.quantization.quant_type": "bitsandbytes 4-bit; tests/test_qlora.py",
    "model.quantization.compute_dtype": "bitsandbytes 4-bit; tests/test_qlora.py",
    "model.quantization.double_quant": "bitsandbytes 4-bit: passed to BitsAndBytesConfig only",
    "training.data.validation_tasks": "needs the generated built-in pool (~10k tasks); tests/test_train_pool.py",
    "training.data.test_tasks": "needs the generated built-in pool and the test databases; tests/test_train_pool.py",
    "training.data.frontier_tasks": "needs a measured frontier.json beside a model; tests/test_frontier.py",
    "training.wandb.run_name": "passed to wandb.init only (a W&B run per flip)",
    "training.collective_timeout_minutes": "a launched process group; tests/test_multinode.py",
    "training.push_to_hub.repo_id": "uploads to the Hugging Face Hub (network)",
    "training.push_to_hub.private": "uploads to the Hugging Face Hub (network)",
    **{f"env.{name}": "an MCP server episode per flip (seconds); tests/test_environment.py and the env tests"
       for name in ("task_family", "mcp_servers", "call_timeout_s", "sql_timeout_s", "sessions_per_server",
                    "tool_call_format", "offered_tools", "schema_in_prompt", "bind_db_id", "shaping_rewards",
                    "shaping_penalty", "reward.terms", "reward.keep_distinct")},
    "env.tool_map": "needs a server whose tools have other names (mcp-server-sqlite); tests/test_byo_server.py",
    "env.isolation_pool_size": "needs a writable third-party server (mcp-server-sqlite); "
                               "tests/test_isolation_pool.py flips it (1 and 2 processes)",
    "env.reward.gold_cache_size": "an LRU size: changes memory and speed, never a result (no test flips it)",
}


def flip_max_steps(kit: Kit) -> None:
    assert lrs(kit, 2, training__max_steps=2, training__lr_scheduler="linear")[-1] == pytest.approx(0)
    history, _ = kit.loop(max_steps=2)
    assert [m["step"] for m in history] == [1, 2]


def flip_time_budget_minutes(kit: Kit) -> None:
    """One budget (`TrainingConfig.time_budget_s`) on the trainer's clock: run_training's deadline
    counts what a resumed run already spent."""
    import time

    for minutes, left in ((None, None), (2.0, 120.0 - 30.0)):
        config = kit.config(training__time_budget_minutes=minutes)
        trainer = kit.trainer(config)
        trainer.prior_elapsed_s = 30.0  # as `resume` restores it from a checkpoint
        deadline = trainer.deadline_for(config.training.time_budget_s)
        assert deadline is None if left is None else deadline - time.monotonic() == pytest.approx(left, abs=1.0)


def flip_job_budget_minutes(kit: Kit) -> None:
    """The whole job's plan (`JobBudget.for_run`, what run_training starts with): none when null; else
    its minutes, GRPO capped at time_budget_minutes (tests/test_job_budget.py runs a job under one)."""
    from skyrl_tool_agent.jobs.budget import JobBudget

    assert JobBudget.for_run(kit.config(training__job_budget_minutes=None).training) is None
    job = JobBudget.for_run(kit.config(training__job_budget_minutes=2.0, training__time_budget_minutes=1.0).training)
    assert job is not None and (job.total_s, job.grpo_cap_s) == (120.0, 60.0) and job.left_s() <= 120.0


def flip_name_or_path(kit: Kit) -> None:
    from skyrl_tool_agent.policy.loading import resolve_model_path

    assert resolve_model_path(kit.config().model) == str(kit.model_dir)
    assert resolve_model_path(kit.config(model__name_or_path="embedded").model) != str(kit.model_dir)


def flip_embedded_dir(kit: Kit) -> None:
    config = kit.config(model__name_or_path="embedded", model__embedded_dir="~/built")
    assert config.model.resolved_embedded_dir() == Path.home() / "built"


def flip_tasks_per_step(kit: Kit) -> None:
    for n in (2, 5):
        assert len(kit.loader_batches(training__tasks_per_step=n)[0]) == n


def flip_seed(kit: Kit) -> None:
    ids = {seed: [t.task_id for b in kit.loader_batches(3, training__seed=seed) for t in b] for seed in (1, 1, 2)}
    assert ids[1] != ids[2] and ids[1] == [t.task_id for b in kit.loader_batches(3, training__seed=1) for t in b]


def flip_output_dir(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_training writes into the expanded directory (it made a literal `$RUNS` one before)."""
    from skyrl_tool_agent.jobs import train as pipeline

    class Stop(Exception):
        pass

    def stop(*_args: object, **_kwargs: object) -> None:
        raise Stop

    monkeypatch.setenv("RUNS", str(kit.tmp / "runs"))
    monkeypatch.chdir(kit.tmp)
    monkeypatch.setattr(pipeline.TaskSplits, "load", lambda config, **_: None)
    monkeypatch.setattr(pipeline, "ensure_embedded_model", stop)  # right after the run directory is made
    with pytest.raises(Stop):
        pipeline.run_training(kit.config(training__output_dir="$RUNS/a"))
    assert (kit.tmp / "runs" / "a").is_dir() and not (kit.tmp / "$RUNS").exists()
    assert kit.config(training__output_dir="~/a").training.resolved_output_dir() == Path.home() / "a"


def flip_eval_num_tasks(kit: Kit) -> None:
    dev = [t.model_copy(update={"split": "dev"}) for t in TASKS]
    for n in (3, 7):
        config = kit.config(training__eval_num_tasks=n)
        assert len(splits_of(config, [], dev, kit.tmp).run_eval()) == n


def flip_eval_split(kit: Kit) -> None:
    config = kit.config(training__eval_split="validation", training__data__dataset="spider")
    with pytest.raises(UserInputError, match="validation needs the builtin dataset"):
        splits_of(config, [], TASKS, kit.tmp).run_eval()


def flip_eval_every(kit: Kit) -> None:
    for every, evaluated in ((0, [4]), (2, [2, 4])):
        history, _ = kit.loop(training__eval_every=every)
        assert [m["step"] for m in history if "eval/execution_accuracy" in m] == evaluated


class ScriptedEpisodes(PreparedEpisodes):
    """A real trainer whose episodes are scripted per task: member m of task i is solved when
    m < i % 3 (so a task's share of solved samples is known), every collect call recorded."""

    calls: list[tuple[int, int, float]]

    def collect(self, tasks, group_size, params, settings=None, on_episode_done=None):  # type: ignore[no-untyped-def]
        self.calls.append((len(tasks), group_size, params.temperature))
        episodes = [episode(t.task_id, m, float(m < i % 3)) for i, t in enumerate(tasks) for m in range(group_size)]
        for e in episodes:
            e.result.solved = e.result.reward == 1.0
        return episodes


def flip_eval_samples(kit: Kit) -> None:
    for k in (0, 3):
        config = kit.config(training__eval_samples=k, grpo__temperature=0.7)
        trainer = kit.trainer(config, cls=ScriptedEpisodes)
        trainer.calls, trainer.eval_tasks = [], TASKS[:4]
        record = trainer.evaluate()
        if k == 0:
            assert trainer.calls == [(4, 1, 0.0)] and "sampled" not in record
            continue
        assert trainer.calls == [(4, 1, 0.0), (4, 3, 0.7)]  # greedy, then k samples at the training temperature
        assert record["sampled"]["per_task"] == pytest.approx([0, 1 / 3, 2 / 3, 0])
        assert record["sampled"]["pass@k"] == pytest.approx(0.5)
        assert eval_metrics(record)["eval/avg@3"] == pytest.approx(0.25)


def flip_probe(kit: Kit) -> None:
    """`probe_tasks` (the pipeline sets the trainer's fixed set) sampled every `probe_every` steps
    and at the last step, one episode each at the training temperature."""
    for every, probed in ((2, [2, 4]), (3, [3, 4])):
        config = kit.config(training__max_steps=4, training__tasks_per_step=3, grpo__group_size=2,
                            training__probe_tasks=3, training__probe_every=every)
        trainer = kit.trainer(config, build_loader(config, TASKS), ScriptedEpisodes)
        trainer.calls, trainer.probe_tasks = [], TASKS[:3]
        history = trainer.train(RunLogger(trainer.output_dir))
        assert [m["step"] for m in history if "probe/execution_accuracy" in m] == probed
        assert all(m.get("probe/execution_accuracy", 2 / 3) == pytest.approx(2 / 3) for m in history)  # 0, 1, 1
        assert trainer.calls.count((3, 1, 1.0)) == len(probed)  # the probe's collects: 3 tasks x 1


def flip_probe_held_out(kit: Kit) -> None:
    """`probe_held_out_tasks` of the validation split (never trained on; `pipeline.set_probes`, on the
    real built-in splits) join the probe's one collection, after the training tasks, reported apart."""
    from skyrl_tool_agent.jobs.train import set_probes

    validation = None
    for held_out in (0, 2):
        config = kit.config(training__max_steps=2, training__tasks_per_step=3, grpo__group_size=2,
                            training__probe_tasks=3, training__probe_every=2, training__probe_held_out_tasks=held_out)
        trainer = kit.trainer(config, build_loader(config, TASKS[:3]), ScriptedEpisodes)
        splits = TaskSplits.load(config)
        set_probes(trainer, config, TASKS[:3], splits)
        validation = validation or {t.task_id for t in splits.validation()}
        assert [t.task_id for t in trainer.probe_tasks] == [t.task_id for t in TASKS[:3]]
        assert len(trainer.held_out_probe_tasks) == held_out
        assert {t.task_id for t in trainer.held_out_probe_tasks} <= validation
        trainer.calls = []
        history = trainer.train(RunLogger(trainer.output_dir))
        probes = [m for m in history if "probe/execution_accuracy" in m]
        assert [m["step"] for m in probes] == [2]
        assert trainer.calls.count((3 + held_out, 1, 1.0)) == 1  # one collection: training tasks, then held-out
        assert probes[0]["probe/execution_accuracy"] == pytest.approx(2 / 3)  # scripted: tasks 0, 1, 2 -> 0, 1, 1
        if held_out:
            assert probes[0]["probe/held_out_execution_accuracy"] == pytest.approx(1 / 2)  # tasks 3, 4 -> 0, 1
            assert probes[0]["probe/held_out_tasks"] == held_out
        else:
            assert "probe/held_out_execution_accuracy" not in probes[0]
    # Training on the built-in training file, the run never generates the pool, nor its validation split.
    config = kit.config(training__probe_held_out_tasks=2, training__data__train_pool="file")
    trainer = kit.trainer(config)
    set_probes(trainer, config, TASKS[:3], TaskSplits.load(config))
    assert trainer.held_out_probe_tasks == []


def flip_checkpoint_every(kit: Kit) -> None:
    for every, kept in ((0, [4]), (1, [3, 4])):  # keep_checkpoints 2
        _, out = kit.loop(training__checkpoint_every=every)
        assert sorted(int(p.name[-6:]) for p in (out / "checkpoints").iterdir() if p.is_dir()) == kept


def flip_keep_checkpoints(kit: Kit) -> None:
    _, out = kit.loop(training__checkpoint_every=1, training__keep_checkpoints=3)
    assert len([p for p in (out / "checkpoints").iterdir() if p.is_dir()]) == 3


def flip_log_every(kit: Kit) -> None:
    _, out = kit.loop(training__log_every=3)
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [3, 4]


def flip_rollouts_every(kit: Kit) -> None:
    _, out = kit.loop(training__rollouts_every=0)
    assert not (out / "rollouts.jsonl").exists()
    _, out = kit.loop(training__rollouts_every=2, training__rollout_groups_per_step=1)
    assert sorted({row["step"] for row in read_metrics(out / "rollouts.jsonl")}) == [2, 4]


def flip_rollout_groups_per_step(kit: Kit) -> None:
    _, out = kit.loop(max_steps=1, training__rollout_groups_per_step=1)
    one = read_metrics(out / "rollouts.jsonl")
    _, out = kit.loop(max_steps=1, training__rollout_groups_per_step=2)
    two = read_metrics(out / "rollouts.jsonl")
    assert len(one) > 1 and len({r["group"] for r in one}) == 1  # a whole group: every member
    assert len(two) == 2 * len(one) and len({r["group"] for r in two}) == 2


def flip_data_paths(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA", "/tmp/d")
    data = kit.config(training__data__train_file="$DATA/t.json", training__data__dev_file="~/v.json",
                      training__data__db_root="$DATA/db").training.data
    assert (data.resolved_train_file(), data.resolved_dev_file(), data.resolved_db_root()) == (
        Path("/tmp/d/t.json"), Path.home() / "v.json", Path("/tmp/d/db"))


def flip_dataset(kit: Kit) -> None:
    data = kit.config(training__data__dataset="spider", training__data__spider_root="/s").training.data
    assert (data.resolved_train_file(), data.resolved_db_root()) == (Path("/s/train_spider_compact.json"), Path("/s/database"))
    assert kit.config().training.data.resolved_train_file().name == "train.json"


def flip_train_pool(kit: Kit) -> None:
    """The frontier's own path (a measured frontier.json, its checks): tests/test_frontier.py."""
    assert kit.config().training.data.resolved_train_pool() == "generated"
    assert kit.config(training__data__train_pool="file").training.data.resolved_train_pool() == "file"
    with pytest.raises(UserInputError, match="needs the embedded model"):
        splits_of(kit.config(training__data__train_pool="frontier"), [], [], kit.tmp).frontier(TASKS)


def flip_test_eval(kit: Kit) -> None:
    """On (the default), the main job evaluates the generated test split (`training.data.test_tasks`
    tasks); off, with GRPO on task files of the run's own (no generated pool to avoid), or under a
    launcher, none. The evaluation before and after, its table and record: tests/test_installed.py."""
    from skyrl_tool_agent.jobs.train import job_test_tasks

    on = kit.config(training__data__test_tasks=4)
    tasks = job_test_tasks(on, TaskSplits.load(on), world_size=1)
    assert len(tasks) == 4 and {t.split for t in tasks} == {"test"}
    off = kit.config(training__data__test_tasks=4, training__test_eval=False)
    own_files = kit.config(training__data__test_tasks=4, training__data__train_pool="file")
    assert job_test_tasks(off, TaskSplits.load(off), world_size=1) == []
    assert job_test_tasks(own_files, TaskSplits.load(own_files), world_size=1) == []
    assert job_test_tasks(on, TaskSplits.load(on), world_size=2) == []


def flip_redraw_constants(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real supervised build (`build_embedded`: oracle episodes through the MCP server, a tiny
    Qwen2, 3 steps) of 4 train.json tasks, batch 16: every step is an epoch. Off, every step trains
    on the same examples; on, each step's examples are new draws (other constants), and the
    held-out queries a draw must avoid are validation's and dev's."""
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.jobs.build_model import build_embedded, redraw_held_out_sql
    from skyrl_tool_agent.warmstart import sft

    trained: list[frozenset[tuple[int, ...]]] = []
    real_loss = sft.token_loss

    def spy(model, batch, *, bf16):  # type: ignore[no-untyped-def]
        rows, lengths = batch["input_ids"].tolist(), batch["attention_mask"].sum(1).tolist()
        trained.append(frozenset(tuple(r[:n]) for r, n in zip(rows, lengths)))
        return real_loss(model, batch, bf16=bf16)

    monkeypatch.setattr(sft, "token_loss", spy)
    steps: dict[bool, list[frozenset[tuple[int, ...]]]] = {}
    for on in (False, True):
        config = Config(model={"embedded_dir": str(kit.tmp / f"built_{on}"), "device": "cpu"},
                        training={"data": {"validation_tasks": 2, "redraw_constants": on}})
        splits = TaskSplits.load(config)
        tasks = [t for t in splits.train if "'" in t.gold_sql][:4]  # each states a string constant
        trained.clear()
        report = build_embedded(config, tasks, splits.validation(), splits.db_root, force=True, sft_steps=3,
                                eval_every=1000)
        assert report["redraw_constants"] is on and len(trained) == 3
        steps[on] = list(trained)
        held = redraw_held_out_sql(config, splits.validation())
        assert (held is None) is (not on)
    assert len(set(steps[False])) == 1  # the same 4 examples every epoch
    assert len(set(steps[True])) == 3  # a fresh draw each epoch
    assert held is not None and {t.gold_sql for t in TaskSplits.load(kit.config()).dev} <= held


def flip_wandb(kit: Kit) -> None:
    w = kit.config(training__wandb__project="p", training__wandb__entity="e", training__wandb__mode="auto").training.wandb
    assert (w.resolved_project({}), w.resolved_entity({}), w.resolved_mode({})) == ("p", "e", "offline")
    assert w.resolved_mode({"WANDB_API_KEY": "k"}) == "online"
    assert kit.config(training__wandb__mode="disabled").training.wandb.resolved_mode({"WANDB_API_KEY": "k"}) == "disabled"


def flip_group_size(kit: Kit) -> None:
    rewards = [1.0, 0.0, 1.0, 0.0]
    assert decided(kit, rewards, 2).kept == [True] * 4
    assert decided(kit, rewards, 4).advantages == pytest.approx([0.866, -0.866, 0.866, -0.866], rel=1e-3)


def flip_advantage_estimator(kit: Kit) -> None:
    rewards = [1.0, 0.0, 0.0]
    sd = statistics.stdev(rewards)
    expected = {"grpo": [2 / 3 / sd, -1 / 3 / sd, -1 / 3 / sd], "dr_grpo": [2 / 3, -1 / 3, -1 / 3],
                "rloo": [1.0, -0.5, -0.5]}
    for name, values in expected.items():
        assert decided(kit, rewards, 3, grpo__advantage_estimator=name).advantages == pytest.approx(values, rel=1e-4)


def flip_scale_advantages_by_batch(kit: Kit) -> None:
    rewards = [0.9, 0.1, 0.3, 0.1]
    sd = statistics.stdev(rewards)
    assert decided(kit, rewards, grpo__scale_advantages_by_batch=True).advantages == pytest.approx(
        [0.4 / sd, -0.4 / sd, 0.1 / sd, -0.1 / sd], rel=1e-4)


def flip_filter_uniform_groups(kit: Kit) -> None:
    on, off = (decided(kit, [1.0, 0.0, 0.5, 0.5], grpo__filter_uniform_groups=f) for f in (True, False))
    assert (on.kept, on.groups_dropped) == ([True, True, False, False], 1)
    assert (off.kept, off.groups_dropped) == ([True] * 4, 0)


class AlternatingGroups(GRPOTrainer):
    """A real trainer whose rollouts give a task with an even last digit a mixed group, others a uniform one."""

    def collect(self, tasks, group_size, params, settings=None, on_episode_done=None):  # type: ignore[no-untyped-def]
        vocab = self.policy.model.config.vocab_size
        return [episode(t.task_id, m, float(m == 0) if int(t.task_id[-1]) % 2 == 0 else 0.0, vocab=vocab)
                for t in tasks for m in range(group_size)]


def flip_refill_rounds(kit: Kit) -> None:
    outs = {}
    for rounds in (0, 4):
        config = kit.config(training__tasks_per_step=4, grpo__group_size=2, grpo__refill_rounds=rounds,
                            grpo__curriculum__mode="uniform")
        outs[rounds] = kit.trainer(config, build_loader(config, TASKS), AlternatingGroups).train_step()
    off, on = outs[0], outs[4]
    mixed = [int(t.task_id[-1]) % 2 == 0 for t in on.tasks]
    assert len(off.tasks) == 4 and off.metrics["train/refill_rounds"] == 0
    assert off.metrics["train/trajectories_used"] == 2 * sum(int(t.task_id[-1]) % 2 == 0 for t in off.tasks) < 8
    assert on.tasks[:4] == off.tasks and len(on.tasks) > 4 and 1 <= on.metrics["train/refill_rounds"] <= 4
    assert sum(mixed) == 4 and on.metrics["train/trajectories_used"] == 8  # a full step of informative groups
    assert [on.kept[2 * i] for i in range(len(on.tasks))] == mixed  # exactly the informative groups train
    with pytest.raises(ValueError, match="needs filter_uniform_groups"):
        kit.config(grpo__refill_rounds=1, grpo__filter_uniform_groups=False)


def flip_turn_credit_discount(kit: Kit) -> None:
    tr = episode("t", 0, 1.0, turn_rewards=(-0.05, 1.0))  # turn 0: ids 4-6, turn 1: ids 9-10
    off = kit.trainer(kit.config())._token_credit(tr, 0.5)
    on = kit.trainer(kit.config(grpo__turn_credit_discount=0.9))._token_credit(tr, 0.5)
    assert off == 0.5
    assert on.tolist() == pytest.approx([0] * 4 + [0.45] * 3 + [0, 0] + [0.5] * 2)


def flip_sampling(kit: Kit) -> None:
    trainer = kit.trainer(kit.config(grpo__top_p=0.5, grpo__max_new_tokens_per_turn=7))
    assert (trainer.sampling.top_p, trainer.collector_settings.max_new_tokens_per_turn) == (0.5, 7)


def flip_lockstep(kit: Kit) -> None:
    """env.collector.lockstep: a lockstep collection hands the engine whole batches (each waits for
    every episode in flight); off, every turn goes to the engine as it arrives (continuous). Real
    episodes of the shipped model through the real env. What is checked is the size of each
    `act` call, which the knob decides, not the batches the engine happened to see: on a loaded
    machine all four turns of a continuous collection can be pending at once."""
    import asyncio
    import dataclasses

    from skyrl_tool_agent.config import EnvConfig
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.policy.sampling_params import SamplingParams
    from skyrl_tool_agent.rollout.agents import make_agent
    from skyrl_tool_agent.rollout.collector import TrajectoryCollector
    from tests.fixtures.config_files import REPO
    from tests.fixtures.samplers import shipped_greedy_check

    tasks, settings, policy = shipped_greedy_check(2)
    runtime = EnvRuntime(EnvConfig(), REPO / "data" / "processed" / "databases")
    try:
        sizes: dict[bool, list[int]] = {}
        for lockstep in (True, False):
            deterministic = CollectorSettings.from_config(kit.config(env__collector__lockstep=lockstep)).deterministic
            assert deterministic is lockstep
            agent = make_agent(policy, SamplingParams())
            sizes[lockstep], act = [], agent.act

            async def counted_act(requests, sizes=sizes[lockstep], act=act):
                sizes.append(len(requests))
                return await act(requests)

            agent.act = counted_act
            collector = TrajectoryCollector(runtime, agent, tokenizer=policy.tokenizer,
                                            settings=dataclasses.replace(settings, deterministic=deterministic))
            asyncio.run(collector.collect(tasks, group_size=2))
    finally:
        runtime.close()
    # lockstep: every call holds all 4 episodes in flight; continuous: each turn on its own, as it comes
    assert set(sizes[True]) == {4} and set(sizes[False]) == {1}, sizes
    assert len(sizes[False]) >= 4, sizes  # every episode's turns went one by one
    assert policy._engine is not None  # the engine samples either way, and stays for the run


def flip_engine_memory_fraction(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.engine_memory_fraction: the engine holds the episodes that fit that share of the memory
    (the others wait for a slot); a share without room for one episode is a clear error."""
    from skyrl_tool_agent.memory.device import DeviceMemory
    from skyrl_tool_agent.memory.plan import SlotPlan
    from skyrl_tool_agent.policy import engine as engine_module

    def engine_slots(fraction: float) -> SlotPlan:
        policy = kit.trainer(kit.config(model__engine_memory_fraction=fraction)).policy
        try:
            return policy.rollout_engine(slots=64, capacity=96).plan
        finally:
            policy.release_rollout_engine()

    plan = engine_slots(0.9)  # the machine's RAM: every episode gets a slot
    assert plan.slots == 64
    # A memory of twice the working set and 10.5 slots: half of it holds 8 (and the scratch and root slots).
    memory = DeviceMemory(int(2 * (plan.reserved_bytes + 10.5 * plan.bytes_per_slot)), 0, "of a test")
    monkeypatch.setattr(engine_module, "device_memory", lambda device: memory)
    assert engine_slots(0.5).slots == 8 and engine_slots(1.0).slots > 8
    with pytest.raises(UserInputError, match="engine_memory_fraction"):
        engine_slots(0.25)


def flip_episode_limits(kit: Kit) -> None:
    s = CollectorSettings.from_config(kit.config(grpo__max_turns=5, grpo__max_total_tokens=900,
                                                 env__collector__concurrency=3, env__collector__max_episode_retries=2,
                                                 env__reward__eval_keep_distinct=True), evaluation=True)
    assert (s.max_turns, s.max_total_tokens, s.concurrency, s.max_episode_retries, s.keep_distinct) == (5, 900, 3, 2, True)


def flip_curriculum_mix(kit: Kit) -> None:
    mix = {"easy": 0.2, "medium": 0.3, "hard": 0.5}
    sampler = build_loader(kit.config(grpo__curriculum__start=mix, grpo__curriculum__end={
        "easy": 1.0, "medium": 0.0, "hard": 0.0}), TASKS).sampler
    assert sampler.base_mix(0.0) == pytest.approx(mix) and sampler.base_mix(1.0)["easy"] == pytest.approx(1.0)
    fixed = build_loader(kit.config(grpo__curriculum__mode="uniform", grpo__curriculum__fixed=mix), TASKS).sampler
    assert fixed.base_mix(1.0) == pytest.approx(mix)


def flip_curriculum_adaptive(kit: Kit) -> None:
    knobs = {"grpo__curriculum__adaptive_min_attempts": 3, "grpo__curriculum__adaptive_min_weight": 0.25,
             "grpo__curriculum__adaptive_high": 0.8, "grpo__curriculum__adaptive_low": 0.3,
             "grpo__curriculum__adaptive_ema_alpha": None}  # cumulative rates, for the hand computation
    linear = build_loader(kit.config(grpo__curriculum__mode="linear", **knobs), TASKS).sampler
    sampler = build_loader(kit.config(grpo__curriculum__mode="adaptive", **knobs), TASKS).sampler
    for s in (linear, sampler):
        s.update("solved", 3, 3)
        s.update("young", 2, 2)
        s.update("failed", 0, 4)
        s.update("mixed", 2, 4)
    assert [sampler.weight(t) for t in ("solved", "young", "failed", "mixed")] == [0.25, 1.0, 0.25, 1.0]
    assert linear.weight("solved") == 1.0
    for alpha, rate in ((None, 0.5), (0.25, 0.75), (0.5, 0.5)):  # cumulative; EMA: (1 - a) * 1 + a * 0
        ema = build_loader(kit.config(grpo__curriculum__adaptive_ema_alpha=alpha), TASKS).sampler
        ema.update("t", 1, 1)
        ema.update("t", 0, 1)
        assert ema.state_dict()["stats"]["t"][2] == pytest.approx(rate)  # the pass rate


def flip_batcher(kit: Kit) -> None:
    off = kit.loader_batches(training__tasks_per_step=4, grpo__batcher__max_batch=12)[0]
    assert len(off) == 4
    big = kit.loader_batches(training__tasks_per_step=4, grpo__batcher__enabled=True,
                             grpo__batcher__target_turns=1e9, grpo__batcher__max_batch=12)[0]
    assert len(big) == 12  # max_batch, not capped by tasks_per_step
    small = kit.loader_batches(grpo__batcher__enabled=True, grpo__batcher__target_turns=1.0)[0]
    assert len(small) == 1  # the turn budget: one task always, no more


FLIPS: dict[str, Callable[..., None]] = {
    "training.gradient_accumulation": flip_gradient_accumulation,
    "training.update_epochs": flip_update_epochs,
    "training.micro_batch_size": flip_micro_batch_size,
    "training.micro_batch_tokens": flip_micro_batch_tokens,
    "training.max_grad_norm": flip_max_grad_norm,
    "training.learning_rate": flip_learning_rate,
    "training.weight_decay": flip_weight_decay,
    "training.adam_betas": flip_adam_betas,
    "training.adam_eps": flip_adam_eps,
    "training.lr_scheduler": flip_lr_scheduler,
    "training.warmup_steps": flip_warmup_steps,
    "training.max_steps": flip_max_steps,
    "training.mode": flip_mode,
    "training.tasks_per_step": flip_tasks_per_step,
    "training.seed": flip_seed,
    "training.output_dir": flip_output_dir,
    "training.time_budget_minutes": flip_time_budget_minutes,
    "training.job_budget_minutes": flip_job_budget_minutes,
    "training.eval_num_tasks": flip_eval_num_tasks,
    "training.eval_split": flip_eval_split,
    "training.eval_samples": flip_eval_samples,
    **dict.fromkeys(("training.probe_tasks", "training.probe_every"), flip_probe),
    "training.probe_held_out_tasks": flip_probe_held_out,
    "training.eval_every": flip_eval_every,
    "training.checkpoint_every": flip_checkpoint_every,
    "training.keep_checkpoints": flip_keep_checkpoints,
    "training.log_every": flip_log_every,
    "training.rollouts_every": flip_rollouts_every,
    "training.rollout_groups_per_step": flip_rollout_groups_per_step,
    **dict.fromkeys(("training.data.train_file", "training.data.dev_file", "training.data.db_root"), flip_data_paths),
    **dict.fromkeys(("training.data.dataset", "training.data.spider_root"), flip_dataset),
    "training.data.train_pool": flip_train_pool,
    "training.test_eval": flip_test_eval,
    "training.data.redraw_constants": flip_redraw_constants,
    **dict.fromkeys(("training.wandb.project", "training.wandb.entity", "training.wandb.mode"), flip_wandb),
    "model.lora.r": flip_lora_r,
    "model.lora.alpha": flip_lora_alpha,
    "model.lora.dropout": flip_lora_dropout,
    "model.lora.target_modules": flip_lora_target_modules,
    "model.gradient_checkpointing": flip_gradient_checkpointing,
    "model.dtype": flip_dtype,
    "model.attn_implementation": flip_attn_implementation,
    "model.name_or_path": flip_name_or_path,
    "model.embedded_dir": flip_embedded_dir,
    "grpo.group_size": flip_group_size,
    "grpo.advantage_estimator": flip_advantage_estimator,
    "grpo.scale_advantages_by_batch": flip_scale_advantages_by_batch,
    "grpo.filter_uniform_groups": flip_filter_uniform_groups,
    "grpo.turn_credit_discount": flip_turn_credit_discount,
    "grpo.refill_rounds": flip_refill_rounds,
    "grpo.loss_aggregation": flip_loss_aggregation,
    "grpo.fixed_length_normalizer": flip_fixed_length_normalizer,
    "grpo.temperature": flip_temperature,
    **dict.fromkeys(("grpo.top_p", "grpo.max_new_tokens_per_turn"), flip_sampling),
    "env.collector.lockstep": flip_lockstep,
    "model.engine_memory_fraction": flip_engine_memory_fraction,
    **dict.fromkeys(("grpo.max_turns", "grpo.max_total_tokens", "env.collector.concurrency",
                     "env.collector.max_episode_retries", "env.reward.eval_keep_distinct"), flip_episode_limits),
    **dict.fromkeys(("grpo.clip_eps_low", "grpo.clip_eps_high"), flip_clip_eps),
    **dict.fromkeys(("grpo.kl_coef", "grpo.kl_estimator"), flip_kl),
    "grpo.entropy_coef": flip_entropy_coef,
    **dict.fromkeys(tuple(f"grpo.curriculum.{k}" for k in (
        "mode", "fixed", "start.easy", "start.medium", "start.hard", "end.easy", "end.medium", "end.hard")),
        flip_curriculum_mix),
    **dict.fromkeys(tuple(f"grpo.curriculum.{k}" for k in (
        "adaptive_low", "adaptive_high", "adaptive_min_weight", "adaptive_min_attempts", "adaptive_ema_alpha")),
        flip_curriculum_adaptive),
    **dict.fromkeys(("grpo.batcher.enabled", "grpo.batcher.target_turns", "grpo.batcher.max_batch"), flip_batcher),
}
#: One run per check (several knobs can share one check).
CHECKS = sorted({check.__name__: check for check in FLIPS.values()}.items())


def test_every_knob_is_flipped_or_excused() -> None:
    knobs = set(all_knobs())
    assert not set(FLIPS) & set(NOT_FLIPPED)
    assert sorted(knobs - set(FLIPS) - set(NOT_FLIPPED)) == [], "knobs with no flip case and no listed reason"
    assert sorted((set(FLIPS) | set(NOT_FLIPPED)) - knobs) == [], "flip cases for knobs the schema no longer has"


@pytest.mark.parametrize(("name", "check"), CHECKS, ids=[name for name, _ in CHECKS])
def test_flip(name: str, check: Callable[..., None], model_dir: Path, tmp_path: Path,  # noqa: F811
              monkeypatch: pytest.MonkeyPatch) -> None:
    kit = Kit(model_dir, tmp_path)
    if "monkeypatch" in check.__code__.co_varnames[: check.__code__.co_argcount]:
        check(kit, monkeypatch)
    else:
        check(kit)
