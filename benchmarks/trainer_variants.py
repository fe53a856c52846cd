"""The variants of `bench_trainer_vs_trl.py`, each as "one update on the shared batch", and the workload
(tiny Qwen2 + oracle episodes), ours (`GRPOTrainer._update`), ours without prefix sharing, and TRL's
`GRPOTrainer` driven through one optimizer step. The settings both sides share are the constants below;
see `bench_trainer_vs_trl.py` for what is measured.

Library imports sit inside the functions, so a memory subprocess loads only the side it measures.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import REPO_ROOT

import torch

from skyrl_tool_agent.rollout.turns import Agent  # light: no model, no env

BUILTIN = REPO_ROOT / "data" / "processed"
LORA = {"r": 16, "alpha": 32.0, "dropout": 0.0}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE = 2e-4
CLIP_LOW, CLIP_HIGH = 0.2, 0.28


# ----------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """The shared batch: token ids per episode, their loss masks, prompt lengths and advantages."""

    model_dir: str
    token_ids: list[list[int]]
    loss_mask: list[list[int]]
    prompt_length: list[int]
    advantages: list[float]
    micro_batch: int
    group_size: int

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)

    @property
    def policy_tokens(self) -> int:
        return sum(sum(mask) for mask in self.loss_mask)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__))

    @classmethod
    def load(cls, path: Path) -> Workload:
        return cls(**json.loads(path.read_text()))


class _AlternatingOracle(Agent):
    """Oracle turns; even group members describe the tables first (4 turns), odd ones do not (3)."""

    async def act(self, requests: Sequence[Any]) -> list[Any]:
        from skyrl_tool_agent.rollout.agents import AgentTurn, oracle_turn_texts

        out = []
        for r in requests:
            script = oracle_turn_texts(r.task, describe=r.group_index % 2 == 0)
            out.append(AgentTurn(text=script[min(r.turn, len(script) - 1)]))
        return out


def build_workload(out_dir: Path, prompts: int, group_size: int, micro_batch: int, size: dict[str, int]) -> Workload:
    """Build the tokenizer + tiny Qwen2 under `out_dir` and collect the episodes (real MCP env)."""
    from skyrl_tool_agent.config import EnvConfig
    from skyrl_tool_agent.data.batching import fixed_subset
    from skyrl_tool_agent.data.tasks import load_tasks
    from skyrl_tool_agent.env.chat_format import render_conversation
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.grpo.advantages import group_advantages
    from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
    from skyrl_tool_agent.rollout.agents import OracleAgent
    from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector

    tasks = load_tasks(BUILTIN / "train.json")
    # The exploring 4-turn episode (all tools, db_id passed) these figures were first measured on.
    runtime = EnvRuntime(EnvConfig.exploring(), BUILTIN / "databases")
    try:
        settings = CollectorSettings(max_turns=6, max_total_tokens=8192)
        corpus = asyncio.run(TrajectoryCollector(runtime, OracleAgent(), settings=settings)
                             .collect(fixed_subset(tasks, 64, seed=1), 1))
        tokenizer = train_tokenizer((render_conversation(t.messages, add_generation_prompt=False) for t in corpus),
                                    size["vocab"])
        collector = TrajectoryCollector(runtime, _AlternatingOracle(), tokenizer=tokenizer, settings=settings)
        trajectories = asyncio.run(collector.collect(fixed_subset(tasks, prompts, seed=0), group_size))
    finally:
        runtime.close()
    model = new_tiny_qwen2(tokenizer, hidden_size=size["hidden"], layers=size["layers"], heads=size["heads"],
                           kv_heads=size["kv_heads"], intermediate_size=size["intermediate"])
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    rewards = [float(i % 2 == 0) for i in range(len(trajectories))]
    adv = group_advantages(torch.tensor(rewards).view(-1, group_size)).view(-1)  # every group kept (none filtered)
    return Workload(
        model_dir=str(out_dir),
        token_ids=[t.token_ids for t in trajectories],
        loss_mask=[t.loss_mask for t in trajectories],
        prompt_length=[t.prompt_length for t in trajectories],
        advantages=adv.tolist(),
        micro_batch=micro_batch,
        group_size=group_size,
    )


# ----------------------------------------------------------------------------- ours


def make_ours(w: Workload, tmp: Path) -> Callable[[], float]:
    """`GRPOTrainer._update` on the collated batch; returns a callable doing one update (-> loss)."""
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.grpo.batch import collate
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.policy.qwen import QwenPolicy
    from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory

    config = Config.model_validate({
        "model": {"name_or_path": w.model_dir, "device": "cpu", "dtype": "float32", "lora": LORA,
                  "gradient_checkpointing": False},
        "training": {"micro_batch_size": w.micro_batch, "learning_rate": LEARNING_RATE, "max_grad_norm": 1.0,
                     "update_epochs": 1},
        "grpo": {"group_size": w.group_size, "kl_coef": 0.0, "entropy_coef": 0.0, "loss_aggregation": "token_mean",
                 "clip_eps_low": CLIP_LOW, "clip_eps_high": CLIP_HIGH, "temperature": 1.0},
    })
    policy = QwenPolicy.from_config(config.model, mode="lora")
    # Only _update is exercised: it needs no environment, loader or eval set.
    trainer = GRPOTrainer(config, policy, runtime=None, loader=None, eval_tasks=[], output_dir=tmp)  # type: ignore[arg-type]
    trajectories = [
        Trajectory("t", i, [], EpisodeResult("t", "db"), token_ids=ids, loss_mask=mask,
                   sampling_logprobs=[0.0] * len(ids), prompt_length=p)
        for i, (ids, mask, p) in enumerate(zip(w.token_ids, w.loss_mask, w.prompt_length))
    ]
    batch = collate(trajectories, w.advantages, policy.tokenizer.pad_token_id)
    with torch.no_grad():  # on-policy: old log-probs = the current policy's (what sampling recorded)
        logp, _ = policy.token_logprobs(batch.input_ids, batch.attention_mask, temperature=1.0)
    batch.old_logp = torch.where(batch.loss_mask, logp, torch.zeros_like(logp))

    def update() -> float:
        return float(trainer._update(batch)["loss"])

    return update


# ----------------------------------------------------------------------------- TRL


def trl_micro_batches(w: Workload, pad_id: int) -> list[dict[str, torch.Tensor]]:
    """The batch as TRL's `_generate_and_score_completions` returns it, split like its buffer."""
    n = len(w.token_ids)
    prompts = [ids[:p] for ids, p in zip(w.token_ids, w.prompt_length)]
    completions = [ids[p:] for ids, p in zip(w.token_ids, w.prompt_length)]
    tool_masks = [mask[p:] for mask, p in zip(w.loss_mask, w.prompt_length)]
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    prompt_ids = torch.full((n, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, width_p), dtype=torch.long)
    completion_ids = torch.full((n, width_c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, width_c), dtype=torch.long)
    tool_mask = torch.ones((n, width_c), dtype=torch.long)  # TRL pads tool_mask with 1
    for i, (p, c, m) in enumerate(zip(prompts, completions, tool_masks)):
        prompt_ids[i, width_p - len(p):] = torch.tensor(p)
        prompt_mask[i, width_p - len(p):] = 1
        completion_ids[i, : len(c)] = torch.tensor(c)
        completion_mask[i, : len(c)] = 1
        tool_mask[i, : len(c)] = torch.tensor(m)
    num_items = (completion_mask * tool_mask).sum()
    advantages = torch.tensor(w.advantages, dtype=torch.float32)
    out = []
    for start in range(0, n, w.micro_batch):
        rows = slice(start, min(start + w.micro_batch, n))
        out.append({
            "prompt_ids": prompt_ids[rows], "prompt_mask": prompt_mask[rows],
            "completion_ids": completion_ids[rows], "completion_mask": completion_mask[rows],
            "tool_mask": tool_mask[rows], "advantages": advantages[rows], "num_items_in_batch": num_items,
        })
    return out


def make_trl(w: Workload, tmp: Path) -> Callable[[], float]:
    """TRL's GRPOTrainer driven through one optimizer step on the precomputed batch (see module doc)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    class FixedBatchGRPOTrainer(GRPOTrainer):
        """Generation replaced by the precomputed batch; the loss/update path is TRL's own."""

        def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
            return generation_batch

    n = len(w.token_ids)
    steps = n // w.micro_batch
    tokenizer = AutoTokenizer.from_pretrained(w.model_dir)
    model = AutoModelForCausalLM.from_pretrained(w.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    args = GRPOConfig(
        output_dir=str(tmp / "trl"), report_to="none", use_cpu=True, bf16=False, seed=0,
        per_device_train_batch_size=w.micro_batch, gradient_accumulation_steps=steps, steps_per_generation=steps,
        num_generations=w.group_size, num_iterations=1, beta=0.0, loss_type="dapo",
        epsilon=CLIP_LOW, epsilon_high=CLIP_HIGH, temperature=1.0, gradient_checkpointing=False,
        disable_dropout=True, learning_rate=LEARNING_RATE, lr_scheduler_type="constant", max_grad_norm=1.0,
        max_completion_length=max(len(ids) - p for ids, p in zip(w.token_ids, w.prompt_length)),
        logging_steps=10**9, save_strategy="no",
    )
    peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                             target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = FixedBatchGRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_dict({"prompt": ["unused"] * n}), processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
    trainer.current_gradient_accumulation_steps = steps
    micro = trl_micro_batches(w, tokenizer.pad_token_id)
    model = trainer.model

    def update() -> float:
        loss = 0.0
        for i, inputs in enumerate(micro):
            trainer.accelerator.gradient_state._set_sync_gradients(i == len(micro) - 1)
            loss += float(trainer.training_step(model, inputs, inputs["num_items_in_batch"]))
        trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
        return loss

    return update


def make_ours_noprefix(w: Workload, tmp: Path) -> Callable[[], float]:
    """Ours with the shared-prefix forward switched off (every row runs its whole sequence): shows how
    much of the difference to TRL is prefix sharing. Diagnostic only: flips the module's threshold
    around each update."""
    import skyrl_tool_agent.policy.prefix as prefix

    update = make_ours(w, tmp)

    def plain_update() -> float:
        saved, prefix.MIN_SHARED_PREFIX = prefix.MIN_SHARED_PREFIX, 10**9
        try:
            return update()
        finally:
            prefix.MIN_SHARED_PREFIX = saved

    return plain_update


MAKERS = {"ours": make_ours, "ours_noprefix": make_ours_noprefix, "trl": make_trl}
LABELS = {"trl": "TRL GRPOTrainer", "ours": "ours GRPOTrainer._update",
          "ours_noprefix": "ours, prefix sharing off"}
