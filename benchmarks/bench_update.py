"""Seconds of the GRPO update on CPU, today's code beside this one, on the same rollout batches in one run.

    python benchmarks/bench_update.py [--old .old] [--batches 3] [--reps 3] [--threads 1] [--data FILE]
                                      [--json-out FILE]

`--old DIR`: another checkout's code (`git archive 5b5bf6b skyrl_tool_agent | tar -x -C .old`): its
update runs in a worker process with DIR first on its path, this checkout's in another, on the same
batches from the same starting weights. The batches are `--batches` real steps of the default CPU
main job (shipped embedded model, LoRA, 8 tasks x 8 episodes, its kept groups), collected once with
this checkout's sampler. Each round asks each worker, in alternating order, to run `GRPOTrainer._update`
on every batch, each from the same starting adapters and optimizer state; per round the CPU seconds
of the worker's process (steadier than wall-clock beside other jobs), the wall seconds and the
update's statistics. The table gives medians over rounds, the paired ratio new/old, whether loss,
KL, entropy and gradient norm agree (|difference| <= 1e-5) and each worker's peak RSS (VmHWM).
`--threads`: torch threads per worker (1: CPU seconds are not inflated by threads spinning for a
core that another job holds). `--data FILE`: the collected batches are kept there and read back by
a later run with the same FILE (collection is most of a short run's time). Without `--old`, the new
code alone. Not a unit test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STATS = ("loss", "pg_loss", "kl", "entropy", "grad_norm")


# ---------------------------------------------------------------- worker (runs on either tree)
def worker(path: str, threads: int, count: int) -> None:
    """Read `run` lines on stdin; answer each with one JSON line: per batch CPU s, wall s, stats."""
    import copy

    import torch

    torch.set_num_threads(threads)
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.grpo.batch import TrainBatch
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    saved = torch.load(path, weights_only=False)
    config = Config.model_validate({})
    policy = QwenPolicy.from_config(config.model, mode="lora")
    policy.model.load_state_dict(saved["trainable"], strict=False)
    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=Path(tempfile.mkdtemp()))  # type: ignore[arg-type]
    start = copy.deepcopy({"model": policy.model.state_dict(), "optimizer": trainer.optimizer.state_dict()})
    batches = [TrainBatch(**b) for b in saved["batches"][:count]]
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        out = []
        for batch in batches:
            policy.model.load_state_dict(start["model"])
            trainer.optimizer.load_state_dict(copy.deepcopy(start["optimizer"]))
            cpu, wall = time.process_time(), time.perf_counter()
            stats = trainer._update(batch)
            out.append({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                        **{k: stats.get(k) for k in STATS}})
        status = Path("/proc/self/status")
        hwm = next((int(x.split()[1]) / 2**20 for x in status.read_text().splitlines() if x.startswith("VmHWM")),
                   None) if status.exists() else None
        print(json.dumps({"batches": out, "peak_rss_gib": hwm}), flush=True)


# ---------------------------------------------------------------- driver (this tree)
def collect_batches(n: int, path: Path) -> list[int]:
    """`n` real default steps' update batches (kept groups, collated) and the starting adapters, saved
    to `path`; returns each batch's token count."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_step import build_trainer

    from skyrl_tool_agent.grpo.batch import collate

    batches, tokens = [], []
    with tempfile.TemporaryDirectory() as tmp:
        trainer, runtime = build_trainer(8, 8, Path(tmp))
        try:
            step = 0
            while len(batches) < n and step < 4 * n:
                torch.manual_seed(1000 + step)
                step += 1
                tasks = trainer.loader.next_batch()
                trajectories = trainer.collect(tasks, trainer.config.grpo.group_size, trainer.sampling)
                decided = trainer._decide(trajectories)
                kept = [(t, a) for t, a, k in zip(trajectories, decided.advantages, decided.kept) if k]
                if kept:
                    b = collate([t for t, _ in kept], [trainer._token_credit(t, a) for t, a in kept],
                                trainer.policy.tokenizer.pad_token_id)
                    batches.append({k: getattr(b, k) for k in ("input_ids", "attention_mask", "loss_mask", "old_logp",
                                                               "advantages")})
                    tokens.append(int(b.attention_mask.sum()))
            trainable = {k: v for k, v in trainer.policy.model.state_dict().items() if "lora_" in k}
        finally:
            runtime.close()
    torch.save({"batches": batches, "trainable": trainable}, path)
    return tokens


class Worker:
    def __init__(self, tree: Path, data: Path, threads: int, count: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(data), "--threads", str(threads),
                                      "--batches", str(count)],
                                     cwd=str(tree), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ask(None)

    def ask(self, line: str | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            print(f"error: the update worker exited with status {self.proc.wait()}", file=sys.stderr)
            raise SystemExit(2)
        return json.loads(answer)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="a checkout of today's code (its skyrl_tool_agent/ inside)")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", type=Path, help="keep the collected batches here; reuse them if it exists")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.threads, args.batches)
    if args.old is not None and not (args.old / "skyrl_tool_agent" / "__init__.py").is_file():
        print(f"error: --old {args.old}: no skyrl_tool_agent/ package there", file=sys.stderr)
        raise SystemExit(2)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import Samples, machine_info, paired_ratios, print_table, write_json

    repo = Path(__file__).resolve().parents[1]
    trees = {"new": repo, **({"old": args.old.resolve()} if args.old else {})}
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "batches.pt"
        if args.data is not None and args.data.is_file():
            import torch

            try:
                saved = torch.load(data, weights_only=False)["batches"][: args.batches]
                tokens = [int(b["attention_mask"].sum()) for b in saved]
            except Exception as e:  # noqa: BLE001 - any unreadable file is the same bad input
                print(f"error: --data {data}: not batches this benchmark saved ({type(e).__name__}: {e})",
                      file=sys.stderr)
                raise SystemExit(2) from None
        else:
            tokens = collect_batches(args.batches, data)
        print(f"{len(tokens)} batches of {tokens} tokens; {args.reps} rounds; {args.threads} thread(s) per worker",
              flush=True)
        workers = {name: Worker(tree, data, args.threads, len(tokens)) for name, tree in trees.items()}
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in workers}
        try:
            for name in workers:  # warm-up: first-use costs
                workers[name].ask("run")
            for rep in range(args.reps):
                order = list(workers) if rep % 2 == 0 else list(reversed(workers))
                for name in order:
                    rounds[name].append(workers[name].ask("run"))
                print(f"  round {rep + 1}: " + ", ".join(
                    f"{n} {sum(b['cpu_s'] for b in rounds[n][-1]['batches']):.2f} CPU s" for n in workers), flush=True)
        finally:
            for w in workers.values():
                w.close()
    cpu = {n: Samples([sum(b["cpu_s"] for b in r["batches"]) for r in rounds[n]]) for n in workers}
    wall = {n: Samples([sum(b["wall_s"] for b in r["batches"]) for r in rounds[n]]) for n in workers}
    peak = {n: max(r["peak_rss_gib"] or 0.0 for r in rounds[n]) for n in workers}
    rows = [[n, cpu[n].median, wall[n].median, peak[n]] for n in workers]
    results: dict[str, Any] = {"tokens": tokens, "cpu_s": {n: s.summary() for n, s in cpu.items()},
                               "wall_s": {n: s.summary() for n, s in wall.items()}, "peak_rss_gib": peak}
    if "old" in workers:
        ratio_cpu, ratio_wall = paired_ratios(cpu["new"], cpu["old"]), paired_ratios(wall["new"], wall["old"])
        rows.append(["ratio new/old (paired median)", ratio_cpu.median, ratio_wall.median, "-"])
        new, old = rounds["new"][0]["batches"], rounds["old"][0]["batches"]
        diffs = {k: max(abs((a[k] or 0.0) - (b[k] or 0.0)) for a, b in zip(new, old)) for k in STATS}
        results.update(ratio_cpu=ratio_cpu.summary(), ratio_wall=ratio_wall.summary(), max_abs_diff=diffs,
                       agree=all(v <= 1e-5 for v in diffs.values()))
        print("max |new - old| per batch: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    machine = machine_info()
    print_table("GRPO update on this CPU, same batches: seconds per step's update (medians over rounds)",
                ["code", "CPU s", "wall s", "peak RSS GiB"], rows,
                caption=f"{len(tokens)} batches, {sum(tokens)} tokens; load {machine['load_average']}")
    settings = {"batches": args.batches, "reps": args.reps, "threads": args.threads, "old": str(args.old)}
    path = write_json(args.json_out, "bench_update", settings, results, machine)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
