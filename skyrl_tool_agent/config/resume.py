"""What a resumed launch may change: `--resume` compares this launch's resolved config with the
checkpoint's config.yaml and stops on a knob that changes what training does, rather than train on
with the restored optimizer under other numbers.

`MAY_CHANGE_ON_RESUME` lists what legitimately changes between launches of one run: how long it
runs, where it writes, what it logs and measures, and how (not what) it computes. Every other knob
must equal the checkpoint's.
"""

from __future__ import annotations

import json
from typing import Any

#: Knobs (or `section.prefix.`es, ending in a dot) a resumed launch may set otherwise than its
#: checkpoint's run (README, Training).
MAY_CHANGE_ON_RESUME: tuple[str, ...] = (
    # how long in wall time (training.max_steps is not here: the curriculum's progress and the LR
    # schedule are laid out over it, and the data loader's restored state is tied to it)
    "training.time_budget_minutes", "training.job_budget_minutes",
    # where it reads and writes: the databases' directory (the same databases, moved or copied;
    # which tasks it trains on, the task files, is compared) and the outputs
    "training.data.db_root", "training.data.spider_root", "training.output_dir",
    # what it logs and how often it saves
    "training.wandb.", "training.push_to_hub.", "training.log_every", "training.rollouts_every",
    "training.rollout_groups_per_step", "training.checkpoint_every", "training.keep_checkpoints",
    # what it measures (evaluations and probes read the policy; they do not train it)
    "training.eval_every", "training.eval_num_tasks", "training.eval_split", "training.eval_samples",
    "training.probe_tasks", "training.probe_held_out_tasks", "training.probe_every", "training.test_eval",
    "training.data.test_tasks",
    # how it computes, not what: the device, memory splits (the update keeps the whole batch's
    # normaliser however it is cut), throughput and operational timeouts
    "model.device", "model.engine_memory_fraction", "model.attn_implementation", "model.gradient_checkpointing",
    "training.micro_batch_size", "training.micro_batch_tokens", "training.collective_timeout_minutes",
    "env.sessions_per_server", "env.isolation_pool_size", "env.collector.concurrency", "env.call_timeout_s",
)


def flat_settings(tree: Any, prefix: str = "") -> dict[str, str]:
    """A config tree (`Config.to_dict()`, a config.yaml read back) as `section.key` -> the value as
    JSON: one string per knob, so two resolutions compare knob by knob."""
    flat: dict[str, str] = {}
    if isinstance(tree, dict) and tree:
        for key, item in tree.items():
            flat.update(flat_settings(item, f"{prefix}.{key}" if prefix else str(key)))
    else:
        flat[prefix] = json.dumps(tree, sort_keys=True)
    return flat


def may_change_on_resume(knob: str) -> bool:
    """Whether `knob` (`section.key`) is one a resumed launch may change (`MAY_CHANGE_ON_RESUME`)."""
    return any(knob == allowed or (allowed.endswith(".") and knob.startswith(allowed))
               for allowed in MAY_CHANGE_ON_RESUME)


def resume_differences(launch: dict[str, Any], saved: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(knob, this launch's value, the checkpoint's value) for each knob outside
    `MAY_CHANGE_ON_RESUME` that the two config trees set otherwise, in the launch's order. A knob
    one side does not know (a newer or older version of the schema) is not compared."""
    mine, theirs = flat_settings(launch), flat_settings(saved)
    return [(knob, value, theirs[knob]) for knob, value in mine.items()
            if knob in theirs and theirs[knob] != value and not may_change_on_resume(knob)]
