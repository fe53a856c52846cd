"""The two arms RL is compared on: GRPO from a model, evaluated at marks of its training time
(`GRPOCurve`), and the supervised baseline continuing the same model for the same time
(`continue_warm_start`). Both open their run with `open_run` and evaluate with the trainer's own
routine (`eval.greedy.training_evaluation`), so their figures compare."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.splits import TaskSplits
from skyrl_tool_agent.jobs.build_model import oracle_collector_settings
from skyrl_tool_agent.jobs.run import GRPOParts, open_run
from skyrl_tool_agent.jobs.train import set_probes


def continue_warm_start(config: Config, minutes: float, *, eval_at_minutes: tuple[float, ...] = (),
                        eval_tasks: list[Task] | None = None, progress: Any = None,
                        save_to: Path | None = None, examples: list[tuple[list[int], list[int]]] | None = None,
                        before: dict[str, Any] | None = None, deadline: float | None = None,
                        batch_size: int | None = None, splits: TaskSplits | None = None) -> dict[str, Any]:
    """The supervised baseline for GRPO's gain: continue the warm start (its recipe at the tail
    learning rate, on the tasks GRPO samples) for `minutes` of training time, then evaluate as
    GRPO's evaluations do on `eval_tasks` (default: the run's). `eval_at_minutes` adds evaluations
    on the way (off the training clock). `save_to`: keep the continued model there.

    A caller that has them (the speedrun) passes `examples` (tokenised oracle episodes), `before`
    (the start's evaluation), a monotonic `deadline`, `batch_size` and `splits`. `start_weights`
    in the result: the model's `weights_fingerprint` before training."""
    from skyrl_tool_agent.eval.greedy import training_evaluation
    from skyrl_tool_agent.warmstart.build import oracle_conversations
    from skyrl_tool_agent.warmstart.plateau import continuation_settings
    from skyrl_tool_agent.warmstart.scratch import weights_fingerprint
    from skyrl_tool_agent.warmstart.sft import conversation_to_ids, supervised_finetune

    splits = splits or TaskSplits.load(config)
    train_tasks = splits.rl_train() if examples is None else []
    t = config.training
    with open_run(config, splits.db_root, policy_mode="full") as run:
        policy = run.policy
        tasks = splits.run_eval() if eval_tasks is None else eval_tasks

        def evaluate(_step: int = 0) -> dict[str, Any]:  # GRPOTrainer.evaluate's routine
            return training_evaluation(policy, run.runtime, tasks, config).record

        start_weights = weights_fingerprint(policy.model)
        if before is None:
            before = evaluate()
        if examples is None:
            conversations = oracle_conversations(run.runtime, train_tasks, oracle_collector_settings(config))
            examples = [conversation_to_ids(c, policy.tokenizer) for c in conversations]
        sft = continuation_settings(seed=t.seed + 17, **({"batch_size": batch_size} if batch_size else {}))
        history = supervised_finetune(policy.model, examples, policy.tokenizer.pad_token_id, sft,
                                      evaluate=evaluate, eval_at_seconds=[60 * m for m in eval_at_minutes],
                                      train_seconds=60 * minutes, progress=progress, deadline=deadline)
        if save_to is not None:
            policy.save(save_to)
    curve = [{"minutes": e["seconds"] / 60, **{k: v for k, v in e.items() if k != "seconds"}} for e in history.evals]
    return {"minutes": minutes, "steps": len(history.loss), "before": before, "after": curve[-1], "curve": curve,
            "start_weights": start_weights}


class GRPOCurve:
    """GRPO from the config's model, evaluated on the run's eval tasks at marks of training time:
    `train_for(seconds)` trains until the arm has trained that long in all (evaluations excluded),
    then evaluates; the probe runs as in the main job. Writes metrics.jsonl into `out`; `close()`
    ends the run. `pool`: what it trains on (default `splits.rl_train()`). `start_weights`: the
    `weights_fingerprint` of the model GRPO starts from."""

    def __init__(self, config: Config, out: Path, *, splits: TaskSplits | None = None,
                 pool: list[Task] | None = None) -> None:
        from skyrl_tool_agent.warmstart.scratch import weights_fingerprint

        self.config = config
        splits = splits or TaskSplits.load(config)
        pool = splits.rl_train() if pool is None else pool
        self._run = contextlib.ExitStack()  # closed by `close` (or leaving `with GRPOCurve(...)`)
        with self._run:  # an error while opening closes what was opened
            parts = GRPOParts(pool, splits.run_eval(), out, log_config=False)
            run = self._run.enter_context(open_run(config, splits.db_root, grpo=parts))
            self.trainer, self.run_logger = run.trainer, run.logger
            self.start_weights = weights_fingerprint(self.trainer.policy.model)
            set_probes(self.trainer, config, pool, splits)  # the same fixed sets the main job probes
            self._run = self._run.pop_all()
        self.trained_s = 0.0  # training time so far (rollouts, updates, probes), evaluations excluded
        self.curve: list[dict[str, Any]] = []

    def __enter__(self) -> GRPOCurve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate_start(self) -> dict[str, Any]:
        """The start's evaluation (and probe), logged as step 0."""
        from skyrl_tool_agent.eval.metrics import eval_metrics

        before = self.trainer.evaluate()
        probe = self.trainer.probe() if self.trainer.probes else {}
        self.run_logger.log({"step": 0, **eval_metrics(before), **probe})
        return before

    def train_for(self, training_s: float, *, on_step: Any = None) -> dict[str, Any]:
        """Train until `training_s` seconds of training in all, then evaluate; returns the point
        (`minutes` of training, `step`, the evaluation record). At least one step runs."""
        t0 = time.monotonic()
        self.trainer.train(self.run_logger, deadline=t0 + training_s - self.trained_s, on_step=on_step)
        self.trained_s += time.monotonic() - t0 - self.trainer.last_eval_seconds
        point = {"minutes": self.trained_s / 60, "step": self.trainer.step, **(self.trainer.last_eval or {})}
        self.curve.append(point)
        return point

    @property
    def finished(self) -> bool:
        """Whether `training.max_steps` is reached (no further `train_for` trains)."""
        return self.trainer.step >= self.config.training.max_steps

    def close(self) -> None:
        """Finish the run's logger and stop its servers (once; again is a no-op)."""
        self._run.close()
