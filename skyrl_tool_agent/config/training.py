"""`TrainingConfig` (configs/training_config.yaml): optimiser, step budget, eval/checkpoint cadence,
data, logging and publishing."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from skyrl_tool_agent.config.base import Section, expand_path, knob
from skyrl_tool_agent.config.builtin_paths import DB_DIR, DEV_FILE, TRAIN_FILE, builtin_data_location

#: Files of the Spider release, relative to `spider_root`.
SPIDER_TRAIN_FILE = "train_spider_compact.json"
SPIDER_DEV_FILE = "dev.json"
SPIDER_DB_DIR = "database"


class DataConfig(Section):
    """Which tasks to train and evaluate on. Relative paths you give are relative to the working
    directory; the built-in defaults (null) are the built-in data directory's (a checkout's
    data/processed, else the cache: `config.builtin_paths`, built there on first use)."""

    dataset: Literal["builtin", "spider"] = knob(
        "builtin",
        "Task family. builtin = the project's generated SQLite tasks (a checkout's data/processed, "
        "else built on first use into $SKYRL_TOOL_AGENT_CACHE/builtin); spider = Spider 1.0 read from "
        "spider_root. No profile switches it (which tasks is the user's choice, not the machine's): "
        "a Qwen2.5-1.5B run on Spider sets it to spider itself.",
    )
    train_file: str | None = knob(
        None,
        "Training tasks. null = the dataset's own: the built-in train.json (Task JSON) for "
        "builtin, <spider_root>/train_spider_compact.json (Spider JSON) for spider.",
    )
    dev_file: str | None = knob(
        None,
        "Dev tasks. null = the built-in dev.json for builtin, <spider_root>/dev.json for spider.",
    )
    db_root: str | None = knob(
        None,
        "Database root, Spider layout <db_root>/<db_id>/<db_id>.sqlite. null = "
        "the built-in databases/ for builtin, <spider_root>/database for spider.",
    )
    spider_root: str = knob("../shared/spider", "Spider 1.0 directory (dev.json, database/, ...).")
    train_pool: Literal["auto", "file", "generated", "frontier"] = knob(
        "auto",
        "Which tasks GRPO samples. auto = for the built-in data with its own train file, frontier "
        "when the model is the embedded one and has a frontier.json, else generated; file otherwise "
        "(Spider, or a train_file you give). file = train_file "
        "(for the built-in data these are the warm start's own tasks, which a "
        "warm-started policy has memorised: little left to learn); generated = builtin only: every "
        "slot assignment of the built-in templates whose query is not in dev nor in the validation "
        "split (~10.4k questions, all paraphrases, generated from db_root at start): the questions "
        "the shipped start was trained on to its plateau (oracle episodes; build-model --to-plateau), "
        "so GRPO goes on where supervised training on them has stopped. frontier = builtin and the "
        "embedded model only: the generated pool's tasks whose sampled outcomes were mixed at the "
        "start (its frontier.json, measured by build-model --frontier on those very weights), "
        "revisited epoch after epoch; with grpo.curriculum.mode adaptive, tasks that become always "
        "or never solved fade.",
    )
    frontier_tasks: int | None = knob(
        None,
        "With train_pool frontier: train on this many of the frontier's mixed-outcome tasks, those "
        "whose pass rate at the start is nearest 1/2 (128: each revisited ~6 times in the CPU main "
        "job); null = all of them (632 for the shipped start, ~1.3 visits each). All of them, chosen on "
        "the validation split (session 17, 8 minutes of GRPO each): greedy +3.9 points against 128's "
        "-0.4, avg@4 +1.8 against +1.1; the probe of revisited tasks rises more with 128, held-out "
        "accuracy less.", ge=1,
    )
    validation_tasks: int = knob(
        256,
        "builtin only: gold queries carved out of the generated pool as a validation split (one "
        "question each; no paraphrase of them is trained on, by the shipped start's plateau build "
        "either). The warm-start curve and any tuning read it; dev is only reported.",
        ge=1,
    )
    test_tasks: int = knob(
        256,
        "builtin only: tasks of the test split (`eval --split test`): the built-in templates on "
        "databases the same generator builds with another seed, none sharing a question or a gold "
        "query with train, the pool, validation or dev; never trained on, never used to choose a "
        "setting.",
        ge=1,
    )
    redraw_constants: bool = knob(
        False,
        "Supervised builds (build-model, its --to-plateau continuation): each epoch, every training "
        "task's constants that its question states are redrawn from its database (the question and "
        "the gold query together, the oracle episode rerun for the new answer; never onto a "
        "validation or dev query), so copying the question's constant is the only way to be right. "
        "false = the same examples every epoch. build-model --redraw-constants sets it.",
    )

    @model_validator(mode="after")
    def _generated_pool_is_builtin(self) -> DataConfig:
        if self.train_pool in ("generated", "frontier") and self.dataset != "builtin":
            raise ValueError(f"train_pool {self.train_pool!r} needs dataset 'builtin' (it fills the built-in templates)")
        return self

    def resolved_train_pool(self, frontier_available: bool = False) -> Literal["file", "generated", "frontier"]:
        """`train_pool` with auto decided by the dataset, and by whether the model has a measured
        frontier (`frontier_available`; `eval.splits.train_pool_kind` looks)."""
        if self.train_pool == "auto":
            if self.dataset != "builtin" or self.train_file is not None:
                return "file"
            return "frontier" if frontier_available else "generated"
        return self.train_pool

    def resolved_train_file(self) -> Path:
        """`train_file`, or the dataset's default training file."""
        return self._resolve(self.train_file, TRAIN_FILE, SPIDER_TRAIN_FILE)

    def resolved_dev_file(self) -> Path:
        """`dev_file`, or the dataset's default dev file."""
        return self._resolve(self.dev_file, DEV_FILE, SPIDER_DEV_FILE)

    def resolved_db_root(self) -> Path:
        """`db_root`, or the dataset's default database root."""
        return self._resolve(self.db_root, DB_DIR, SPIDER_DB_DIR)

    def _resolve(self, given: str | None, builtin: str, spider_name: str) -> Path:
        if given is not None:
            return expand_path(given)
        if self.dataset == "spider":
            return expand_path(self.spider_root) / spider_name
        return builtin_data_location() / builtin


class WandbConfig(Section):
    """Weights & Biases logging."""

    project: str | None = knob(None, "W&B project; null = $WANDB_PROJECT, else skyrl-tool-agent.")
    entity: str | None = knob(None, "W&B entity (team or user); null = $WANDB_ENTITY, else your default entity.")
    mode: Literal["auto", "online", "offline", "disabled"] = knob(
        "auto",
        "Logging mode; auto = online when WANDB_API_KEY is set, else offline. Offline runs can "
        "be uploaded later with `wandb sync`; disabled = no W&B at all.",
    )
    run_name: str | None = knob(None, "Run name; null = W&B picks one.")

    def resolved_project(self, environ: Mapping[str, str] | None = None) -> str:
        env = os.environ if environ is None else environ
        return self.project or env.get("WANDB_PROJECT") or "skyrl-tool-agent"

    def resolved_entity(self, environ: Mapping[str, str] | None = None) -> str | None:
        env = os.environ if environ is None else environ
        return self.entity or env.get("WANDB_ENTITY") or None

    def weave_project(self) -> str:
        """Weave's `entity/project` (or `project`) for evaluations of the same W&B project."""
        entity = self.resolved_entity()
        return f"{entity}/{self.resolved_project()}" if entity else self.resolved_project()

    def resolved_mode(self, environ: Mapping[str, str] | None = None) -> Literal["online", "offline", "disabled"]:
        """`mode` with auto decided from WANDB_API_KEY in `environ` (default: os.environ)."""
        if self.mode != "auto":
            return self.mode
        env = os.environ if environ is None else environ
        return "online" if env.get("WANDB_API_KEY") else "offline"


class PushToHubConfig(Section):
    """Uploading the final adapter/model to the Hugging Face Hub."""

    repo_id: str | None = knob(None, "Hub repo pushed to at the end (like 'me/sql-agent'); null = no push.")
    private: bool = knob(True, "Create the repo private.")


class TrainingConfig(Section):
    """Optimisation and run bookkeeping: what is trained, how fast, how long, what is saved."""

    mode: Literal["lora", "full"] = knob(
        "lora",
        "What is trained. lora = adapters on a frozen base (QLoRA with model.quantization); full = "
        "all parameters (multi-GPU: DeepSpeed ZeRO-3 via configs/accelerate_config.yaml).",
    )
    learning_rate: float = knob(
        1e-3,
        "Peak AdamW learning rate. CPU value chosen on the validation split with the frontier pool "
        "(128 tasks revisited: avg@4 +1.9 at 1e-3 against +0.6 for all 632 at 3e-4 and +0.4 for the "
        "whole pool; on the whole pool 3e-3 broke 51 tasks, 1e-3 8-13, 3e-4 4); on H100 "
        "use 1e-5 for full and 1e-5..5e-5 for LoRA.",
        h100=2e-5,
        gt=0,
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = knob(
        "constant",
        "Learning-rate decay after warmup. The schedule counts updates (steps whose rollout batch "
        "trained): a step whose groups were all dropped does not advance it, so linear and cosine "
        "reach 0 at max_steps only if every step trained.",
    )
    warmup_steps: int = knob(
        0, "Linear warmup from 0 over this many updates. Steps that did not train (all groups dropped) do "
        "not count; see lr_scheduler.", h100=10, ge=0
    )
    weight_decay: float = knob(0.0, "AdamW weight decay.", ge=0)
    adam_betas: tuple[float, float] = knob((0.9, 0.999), "AdamW (beta1, beta2).")
    adam_eps: float = knob(1e-8, "AdamW epsilon.", gt=0)
    max_steps: int = knob(
        200, "Training steps (one rollout batch + its updates each). On CPU the time budget ends "
        "the run first (~70 steps in 10.5 min).", h100=300, ge=1
    )
    tasks_per_step: int = knob(
        8,
        "Tasks (prompts) per step, when grpo.batcher.enabled is off. No effect while it is on (the "
        "gpu profile turns it on): the batcher sizes each step instead, up to grpo.batcher.max_batch tasks within "
        "grpo.batcher.target_turns expected turns (a warning at load says so when you set this "
        "with the batcher on). Each task is rolled out grpo.group_size times. On CPU a step's "
        "rollout costs about the decode steps of its longest episode, so 64 episodes cost ~1.5x "
        "what 16 do.",
        h100=16,
        ge=1,
    )
    micro_batch_size: int = knob(
        8, "Sequences per forward/backward pass (per GPU). H100: 8 episodes at grpo.max_total_tokens need "
        "13.3 GiB for Qwen2.5-1.5B (measured on random weights, H200, 2026-11-27); skyrl_tool_agent/memory/ "
        "plans the update beside the rollout engine (docs/distributed.md, Memory).",
        h100=8, ge=1
    )
    micro_batch_tokens: int | None = knob(
        None,
        "Token budget of a forward/backward pass: rows (sorted by length within each optimizer step) "
        "join a micro-batch while rows x its longest row stays within it, at most micro_batch_size rows; "
        "null = micro_batch_size rows in rollout order (padded to the longest). Single process only. "
        "H100: 49152 (8 rows of grpo.max_total_tokens; shorter rows fill the same budget).",
        h100=49152, ge=1,
    )
    gradient_accumulation: int | None = knob(
        None,
        "Micro-batches per optimizer step; null = derived. Derived means one optimizer step per "
        "update epoch over the whole rollout batch (Config.nominal_gradient_accumulation() gives "
        "the count without filtered groups); an integer N = a step every N micro-batches "
        "(PPO-style minibatches, several optimizer steps per rollout batch, each minibatch's loss "
        "normalised over its own tokens; the last one may be shorter). Single process only.",
        ge=1,
    )
    update_epochs: int = knob(1, "Passes over each rollout batch (>1 = reuse samples, needs clipping).", ge=1)
    max_grad_norm: float = knob(1.0, "Gradient clipping norm; 0 = no clipping.", ge=0)
    eval_every: int = knob(
        0, "Evaluate on the dev subset every N steps; 0 = only before and after training.", h100=25, ge=0
    )
    eval_num_tasks: int = knob(
        320, "Size of the fixed, stratified dev subset evaluated before, during and after training "
        "(greedy); at least the dev size = every dev task (320 built-in). Subsets of 64 made a "
        "before/after difference noise (one task = 1.6 points).", h100=200, ge=1
    )
    eval_split: Literal["dev", "validation"] = knob(
        "dev",
        "What the before/during/after evaluations run on. dev = the reported yardstick (never tune "
        "on it); validation = the generated pool's validation split (training.data.validation_tasks; "
        "builtin only), for choosing settings.",
    )
    eval_samples: int = knob(
        2,
        "Besides greedy, each before/during/after evaluation samples this many episodes per task at "
        "the training temperature (grpo.temperature, top_p) and reports avg@k (mean success over "
        "the k samples: sampled pass@1, the figure RL papers report) and pass@k, with a paired "
        "interval of the avg@k change; 0 = greedy only. The draws are common random numbers (the same "
        "seeds in every evaluation), so the change measures the policy, not two draws' luck. CPU "
        "default 2: with greedy, ~2.4 min per evaluation of the 320 dev tasks on 2 cores (4: ~4 min).", ge=0,
    )
    test_eval: bool = knob(
        True,
        "The main job also evaluates the test split (training.data.test_tasks in-family tasks on "
        "databases of their own, never trained on and never used to choose a setting; the built-in "
        "data with GRPO on its generated pool only) before and after GRPO, greedy and avg@k like eval_split, and reports both splits in "
        "its final table and before_after.json (`test`). The job budget sizes the two splits "
        "together. Not under a launcher (more than one rank): evaluate final/ with `eval --split "
        "test` afterwards.",
    )
    probe_tasks: int = knob(
        64,
        "A fixed, stratified set of this many training tasks, one episode each sampled at the "
        "training temperature every probe_every steps (and before the first): the success of the "
        "same revisited tasks over time (probe/execution_accuracy, drawn in training_curves.png); "
        "0 = no probe.", ge=0,
    )
    probe_held_out_tasks: int = knob(
        64,
        "A fixed, stratified set of this many held-out tasks the run never trains on (the validation "
        "split: the generated pool's held-out questions, on Spider a fixed part of dev), probed "
        "beside probe_tasks in the same way: probe/held_out_execution_accuracy, the line of "
        "training_curves.png that says whether what the run learns on its own tasks carries over; 0 = none. "
        "Not with train_pool file on the built-in data unless eval_split is validation (the pool, and so "
        "its validation split, is then not generated; the log says so).",
        ge=0,
    )
    probe_every: int = knob(15, "Steps between probes of the probe_tasks and probe_held_out_tasks (see there).", ge=1)
    checkpoint_every: int = knob(10, "Save a checkpoint every N steps; 0 = only at the end.", h100=50, ge=0)
    keep_checkpoints: int = knob(2, "Most recent checkpoints kept (older ones are deleted).", h100=3, ge=1)
    log_every: int = knob(1, "Log metrics every N steps.", ge=1)
    rollouts_every: int = knob(
        1, "Save sampled training episodes (conversation, tool calls, reward terms, advantage, final vs gold "
        "SQL) to rollouts.jsonl, and a W&B table when W&B is on, every N steps; 0 = never.", h100=10, ge=0)
    rollout_groups_per_step: int = knob(
        2, "GRPO groups saved per saved step, whole: every episode of each, with its reward terms and advantage "
        "(a group's contrast is what the update learns from).", ge=1)
    seed: int = knob(42, "Seed for data order, sampling and initialisation.")
    output_dir: str = knob("outputs/grpo", "Run directory: checkpoints, metrics, resolved config.")
    time_budget_minutes: float | None = knob(
        8.0,
        "Stop cleanly (with a checkpoint) after this many minutes of GRPO (counted from after the "
        "first evaluation); null = no limit. GRPO may get less: job_budget_minutes keeps the whole job "
        "(load, the two evaluations, GRPO and its probes) within its minutes.",
        h100=None,
        gt=0,
    )
    job_budget_minutes: float | None = knob(
        14.5,
        "The whole main job's wall time, from the start of the run (load, the probe, the evaluations "
        "before and after GRPO, GRPO, saving, the report): the evaluations are sized from the step-0 "
        "probe's measured speed (a stratified subset of the eval tasks, the same before and after; "
        "see skyrl_tool_agent/jobs/budget.py), and GRPO gets the time left between them, at most "
        "time_budget_minutes. The start of the run logs the plan; null = no whole-job limit.",
        h100=None,
        gt=0,
    )
    collective_timeout_minutes: float = knob(
        10.0,
        "Under a launcher: how long one rank waits for the others in a collective (a barrier, a gather of "
        "rollouts, a gradient sum) before the run stops with a line naming the rank that stopped answering. "
        "Longer than the slowest thing one rank does while the others wait: a step's rollout imbalance, "
        "rank 0 writing a checkpoint or building the embedded model (--rebuild). A rank whose process "
        "died is named within seconds when a collective fails on it (gloo), at this timeout when one waits "
        "for it (NCCL) (docs/distributed.md, Several nodes).",
        gt=0,
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Datasets and database root.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases logging.")
    push_to_hub: PushToHubConfig = Field(default_factory=PushToHubConfig, description="Hub upload.")

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value

    @property
    def time_budget_s(self) -> float | None:
        """`time_budget_minutes` in seconds, as the trainer's clock (`GRPOTrainer.elapsed_s`) and the
        progress bar read it; None = no limit."""
        return None if self.time_budget_minutes is None else 60.0 * self.time_budget_minutes

    def resolved_output_dir(self) -> Path:
        """`output_dir` with `~` and $VARS expanded."""
        return expand_path(self.output_dir)
