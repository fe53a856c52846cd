"""Seconds per GRPO step of the CPU quick start's trainer, by phase, with the FLOP floor and peak RSS.

    python benchmarks/bench_step.py [--reps 3] [--warmup 1] [--tasks-per-step 8] [--group-size 8]
                                    [--profile] [--json-out FILE]

The CPU quick start's trainer as configured by default (shipped embedded model, LoRA, generated
train pool, lockstep collection), one `GRPOTrainer.train_step` per round, medians over rounds. Before
each round the trainer's whole state (weights, optimizer, scheduler, loader, step counter, hence the
tasks and the sampling seed) is restored to the previous round's end. `--old DIR` also measures an
earlier commit's step (e.g. `git archive 5b5bf6b skyrl_tool_agent benchmarks | tar -x -C .old`): its
own copy of this script, run in a subprocess right before and right after this one's rounds, with
its CPU sampler (`Qwen2Kernel` batches at 5b5bf6b) as both of its variants; the table puts its
medians beside these, with the ratios.

Per step: rollout (`time/rollout_s`), update (`time/update_s`) and the rest (advantages, curriculum,
metrics); policy tokens/s = sampled tokens / step seconds. The FLOP floor is the step's model FLOPs (`step_flops`: a forward over
every distinct token of the rollout, forward + backward (3x) over the update's tokens with each
micro-batch's shared prefix once) divided by the best matmul GFLOP/s measured here. `--profile`
adds a torch-profiler table of one step. The process's peak RSS (VmHWM, `memory/peak_rss_gib`
in a run's metrics) is printed and written. Not a unit test.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (also puts the repo root on sys.path)
    Samples,
    add_common_args,
    console,
    interleaved,
    load_note,
    machine_info,
    print_table,
    write_json,
)

import torch  # noqa: E402

from skyrl_tool_agent.config import Config  # noqa: E402
from skyrl_tool_agent.env.pools import EnvRuntime  # noqa: E402
from skyrl_tool_agent.grpo.trainer import GRPOTrainer  # noqa: E402
from skyrl_tool_agent.memory.device import peak_rss_gib  # noqa: E402
from skyrl_tool_agent.eval.splits import TaskSplits  # noqa: E402
from skyrl_tool_agent.data.loader import build_loader  # noqa: E402
from skyrl_tool_agent.distributed.local import LocalBackend
from skyrl_tool_agent.policy.prefix import common_prefix_length  # noqa: E402
from skyrl_tool_agent.rollout.trajectory import Trajectory  # noqa: E402

VARIANTS = ("engine",)
LABELS = {"engine": "RolloutEngine (root slot, lockstep)"}


def matmul_gflops(shapes: Sequence[tuple[int, int, int]] = ((1024, 1024, 1024), (512, 256, 1024), (64, 256, 768)),
                  reps: int = 20) -> dict[str, float]:
    """Best-of-`reps` float32 GFLOP/s of `[m, k] @ [k, n]` per shape (the big one bounds the CPU;
    the others are this model's prefill and decode shapes)."""
    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return out


def forward_flops(tokens: int, context_start: int, config: Any, *, logits: int) -> float:
    """FLOPs of a forward over `tokens` positions following `context_start` cached ones, with LM-head
    logits at `logits` of them: 2 per weight per token, plus attention's QK^T and AV."""
    h, layers = config.hidden_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * config.intermediate_size
    contexts = tokens * context_start + tokens * (tokens + 1) / 2  # sum of attended lengths
    return 2 * layers * per_layer * tokens + 4 * layers * h * contexts + 2 * h * config.vocab_size * logits


def step_flops(trajectories: Sequence[Trajectory], group_size: int, micro_batch: int, kept: Sequence[bool],
               config: Any) -> dict[str, float]:
    """The least model FLOPs of a step: the rollout runs each group's prompt once and every other
    token once (logits only where a token is sampled); the update runs forward + backward (~3x a
    forward) over its micro-batches, each micro-batch's common prefix once."""
    rollout = 0.0
    for g in range(0, len(trajectories), group_size):
        group = [t for t in trajectories[g:g + group_size] if t.token_ids]
        if not group:
            continue
        prompt = group[0].prompt_length
        rollout += forward_flops(prompt, 0, config, logits=1)
        for t in group:
            rest = len(t.token_ids) - prompt
            rollout += forward_flops(rest, prompt, config, logits=sum(t.loss_mask))
    update = 0.0
    used = [t for t, k in zip(trajectories, kept) if k and t.token_ids]
    for m in range(0, len(used), micro_batch):
        rows = [t.token_ids for t in used[m:m + micro_batch]]
        shared = common_prefix_length(rows)
        update += 3 * forward_flops(shared, 0, config, logits=shared)
        for r in rows:
            update += 3 * forward_flops(len(r) - shared, shared, config, logits=len(r) - shared)
    return {"rollout": rollout, "update": update, "total": rollout + update}


class StepRunner:
    """One trainer; each call restores the round's starting state and runs one step with a sampler.

    Besides the trainer's wall-clock `time/*`, the CPU seconds of this process (all its threads)
    in the rollout and the update are recorded: beside other jobs on 2 cores wall-clock figures
    swing by 2x from one step to the next, CPU time much less.
    """

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer
        self.start = self._snapshot()
        self.cpu = {"rollout": 0.0, "update": 0.0}
        trainer.collect = self._cpu_timed("rollout", trainer.collect)  # type: ignore[method-assign]
        trainer._update = self._cpu_timed("update", trainer._update)  # type: ignore[method-assign]
        self.seconds: dict[str, dict[str, Samples]] = {}
        self.last: dict[str, Any] = {}
        self.flops: list[dict[str, float]] = []

    def _cpu_timed(self, phase: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[phase] += time.process_time() - start
        return run

    def _snapshot(self) -> dict[str, Any]:
        t = self.trainer
        return copy.deepcopy({"model": t.policy.model.state_dict(), "optimizer": t.optimizer.state_dict(),
                              "scheduler": t.scheduler.state_dict(), "loader": t.loader.state_dict(), "step": t.step})

    def _restore(self, state: dict[str, Any]) -> None:
        t = self.trainer
        t.policy.model.load_state_dict(state["model"])
        t.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        t.scheduler.load_state_dict(state["scheduler"])
        t.loader.load_state_dict(copy.deepcopy(state["loader"]))
        t.step = state["step"]

    def step(self, name: str) -> float:
        self._restore(self.start)
        self.cpu = {"rollout": 0.0, "update": 0.0}
        t0, cpu0 = time.perf_counter(), time.process_time()
        out = self.trainer.train_step()
        total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        m = out.metrics
        record = self.seconds.setdefault(name, {k: Samples() for k in (
            "step", "rollout", "update", "rest", "tok/s", "cpu step", "cpu rollout", "cpu update")})
        record["cpu step"].add(cpu)
        record["cpu rollout"].add(self.cpu["rollout"])
        record["cpu update"].add(self.cpu["update"])
        record["step"].add(total)
        record["rollout"].add(m["time/rollout_s"])
        record["update"].add(m["time/update_s"])
        record["rest"].add(total - m["time/rollout_s"] - m["time/update_s"])
        record["tok/s"].add(m["policy_tokens"] / total)
        self.last[name] = out
        return total

    def end_round(self) -> None:
        """Count the step's FLOPs and continue from its state."""
        new = self.last["engine"]
        cfg = self.trainer.config
        model_cfg = getattr(self.trainer.policy.model, "get_base_model", lambda: self.trainer.policy.model)().config
        self.flops.append(step_flops(new.trajectories, cfg.grpo.group_size, cfg.training.micro_batch_size, new.kept,
                                     model_cfg))
        self.start = self._snapshot()


def profile_step(runner: StepRunner, name: str, top: int = 15) -> str:
    """torch-profiler table (by self CPU time) of one step with sampler `name`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.step(name)
    return f"==== torch profiler, one step, {LABELS[name]}\n" + prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=top)


def run_old(old: Path, args: argparse.Namespace, reps: int) -> dict[str, list[float]]:
    """`old`'s bench_step.py in a subprocess, its CPU sampler (`Qwen2Kernel`, 5b5bf6b's `model.sampler`
    kernel) as both of its variants: per phase, the seconds of every step it timed."""
    code = ("import sys; sys.path.insert(0, sys.argv[1] + '/benchmarks'); import bench_step as b; "
            "b.VARIANTS = {'old': 'kernel', 'new': 'kernel'}; sys.argv = sys.argv[1:]; b.main()")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "old.json"
        cmd = [sys.executable, "-c", code, str(old), "--reps", str(reps), "--warmup", str(args.warmup),
               "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size), "--json-out", str(out)]
        subprocess.run(cmd, check=True, cwd=old, env={**os.environ, "PYTHONPATH": str(old)}, capture_output=True)
        variants = json.loads(out.read_text())["results"]["variants"]
    return {k: variants["old"][k]["values"] + variants["new"][k]["values"] for k in variants["new"]
            if isinstance(variants["new"][k], dict) and "values" in variants["new"][k]}


def build_trainer(tasks_per_step: int, group_size: int, out: Path) -> tuple[GRPOTrainer, EnvRuntime]:
    config = Config.model_validate({"training": {"tasks_per_step": tasks_per_step, "output_dir": str(out)},
                                    "grpo": {"group_size": group_size}})
    splits = TaskSplits.load(config)
    runtime = EnvRuntime(config.env, splits.db_root)
    trainer = LocalBackend().build_trainer(config, runtime, build_loader(config, splits.rl_train()), [], out)
    return trainer, runtime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="also a torch-profiler table of one step per variant")
    parser.add_argument("--old", type=Path, default=None,
                        help="an earlier commit's tree (skyrl_tool_agent, benchmarks): its step measured before and after")
    add_common_args(parser, "bench_step", reps=3)
    args = parser.parse_args(argv)

    old_steps: dict[str, list[float]] = {}

    def measure_old() -> None:
        if args.old is not None:
            console.print(f"old: {args.old} (its Qwen2Kernel sampler), {max(1, args.reps // 2)} rounds x 2 variants")
            for k, v in run_old(args.old.resolve(), args, max(1, args.reps // 2)).items():
                old_steps.setdefault(k, []).extend(v)

    measure_old()
    torch.manual_seed(0)
    gflops = matmul_gflops()
    with tempfile.TemporaryDirectory() as tmp:
        trainer, runtime = build_trainer(args.tasks_per_step, args.group_size, Path(tmp))
        try:
            runner = StepRunner(trainer)
            episodes = args.tasks_per_step * args.group_size
            console.print(f"{episodes} episodes per step; {args.reps} rounds + {args.warmup} warm-up; "
                          f"matmul GFLOP/s {', '.join(f'{k} {v:.1f}' for k, v in gflops.items())}")
            loads = []

            def on_round(rep: int, values: dict[str, float]) -> None:
                runner.end_round()
                loads.append(machine_info()["load_average"][0])
                console.print(f"  round {rep + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in values.items())
                              + f"; load {loads[-1]}")

            for _ in range(args.warmup):  # untimed: first-use costs (kernels, MCP sessions)
                runner.step("engine"), runner.end_round()
            runner.seconds.clear()
            runner.flops = []
            interleaved({n: (lambda n=n: runner.step(n)) for n in VARIANTS}, args.reps, warmup=0, on_rep=on_round)
            profile_text = "\n".join(profile_step(runner, n) for n in VARIANTS) if args.profile else None
        finally:
            runtime.close()
    measure_old()

    machine = machine_info()
    peak = max(gflops.values())
    flops = {k: Samples([f[k] for f in runner.flops]).median for k in ("rollout", "update", "total")}
    floor = {k: v / (peak * 1e9) for k, v in flops.items()}
    s = runner.seconds
    rows = []
    for name in VARIANTS:
        r = s[name]
        rows.append([LABELS[name], r["step"].median, r["rollout"].median, r["update"].median, r["rest"].median,
                     r["tok/s"].median])
    for row, name in zip(rows, VARIANTS):
        row += [s[name][k].median for k in ("cpu step", "cpu rollout", "cpu update")]
    columns = ("step", "rollout", "update", "rest", "tok/s", "cpu step", "cpu rollout", "cpu update")
    old = {k: Samples(old_steps[k]).median for k in columns} if old_steps else None
    if old:
        rows.append([f"old: Qwen2Kernel ({args.old})", *(old[k] for k in columns)])
        new = {k: s["engine"][k].median for k in columns}
        rows.append(["ratio engine / old", *(new[k] / old[k] if old[k] else float("nan") for k in columns)])
    rows.append([f"FLOP floor at {peak:.0f} GFLOP/s", floor["total"], floor["rollout"], floor["update"], "-", "-",
                 floor["total"], floor["rollout"], floor["update"]])
    print_table("GRPO step on this CPU: seconds (medians over rounds)",
                ["sampler", "step s", "rollout s", "update s", "rest s", "policy tok/s", "CPU s step", "CPU s rollout",
                 "CPU s update"], rows,
                caption=f"{episodes} episodes/step; "
                        f"peak RSS of this process {peak_rss_gib():.2f} GiB (VmHWM, every round); "
                        f"load during rounds {loads}; {load_note(machine)}")
    if profile_text:
        console.print(profile_text, markup=False, highlight=False)
    results = {
        "variants": {name: {"label": LABELS[name], **{k: v.summary() for k, v in s[name].items()}} for name in VARIANTS},
        "matmul_gflops": gflops,
        "flops_per_step": flops,
        "flop_floor_s": floor,
        "load_average_per_round": loads,
        "peak_rss_gib": peak_rss_gib(),
        "old": ({"dir": str(args.old), "sampler": "Qwen2Kernel", **{k: Samples(v).summary() for k, v in old_steps.items()},
                 "ratio_engine_over_old": {k: s["engine"][k].median / Samples(old_steps[k]).median
                                           for k in old_steps if k in s["engine"] and Samples(old_steps[k]).median}}
                if old_steps else None),
        "profile_top": profile_text,
    }
    settings = {"tasks_per_step": args.tasks_per_step, "group_size": args.group_size, "reps": args.reps,
                "old": str(args.old) if args.old else None,
                "warmup": args.warmup, "config": "defaults (cpu profile): shipped embedded model, LoRA, lockstep"}
    path = write_json(args.json_out, "bench_step", settings, results, machine)
    if path:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
