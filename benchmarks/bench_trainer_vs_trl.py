"""One GRPO update, ours vs TRL's `GRPOTrainer`: tokens/s and peak memory on the same batch.

    python benchmarks/bench_trainer_vs_trl.py [--prompts 2] [--group-size 8] [--micro-batch 4]
                                              [--threads 1] [--reps 3] [--json-out FILE]

Workload (built once, shared by both): a tiny Qwen2 with the embedded default's shape (own BPE
tokenizer, random init) and multi-turn oracle episodes on built-in tasks, collected through the real
environment: prompt = system (with the tool list) + user turn; completion = the assistant turns and
the tool responses between them; the loss covers the assistant tokens only. `--prompts` tasks x
`--group-size` episodes; group members alternate between the 4-turn oracle (with describe_table) and
the 3-turn one, so lengths vary within a group. Advantages come from alternating rewards.

Both sides: LoRA r=16, alpha=32, dropout 0 on all attention/MLP projections, float32 on CPU, no
gradient checkpointing, no KL term, entropy computed but not in the loss, token-mean loss
(ours `token_mean` = TRL `loss_type="dapo"`), clip 0.2/0.28, one AdamW step over the whole batch
with micro-batches of `--micro-batch` sequences, gradient clipping at 1.0, on-policy
(old log-probs = current policy).

  ours   `GRPOTrainer._update(batch)` on the `TrainBatch` from `skyrl_tool_agent.grpo.batch.collate`
  TRL    `trl.GRPOTrainer` (subclass whose `_prepare_inputs` returns our precomputed batch): for each
         micro-batch `training_step` (its `compute_loss` + backward), then its grad clipping,
         `optimizer.step()`, `lr_scheduler.step()`, `zero_grad()`, which is the body of one
         optimizer step in `Trainer.train`. The batch is laid out as TRL's
         `_generate_and_score_completions` lays it out (prompts left-padded, completions
         right-padded over the whole generation batch, `tool_mask` = 0 on tool output), then split
         into micro-batches.
  ours, prefix sharing off
         ours with `skyrl_tool_agent.policy.prefix` disabled (every row runs its whole sequence, as
         TRL does): separates what prefix sharing buys from the rest of the loss path.

tokens/s = non-padding tokens of the batch (prompt + completion) / seconds per update. Speed is
measured in this process, ours and TRL interleaved, medians over repetitions. Peak memory is measured
per variant in a fresh subprocess: RSS sampled with psutil during `--mem-updates` updates, reported
as the increase over the RSS just before the first update (the update's own memory: activations,
gradients, optimizer state) and as the absolute peak. Torch runs 1 intra-op thread by default
(`--threads`): on a 2-core machine shared with other jobs, 2 threads made update times vary 5x from
one repetition to the next (one thread waits at every op for the other to be scheduled). Not a unit
test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (also puts the repo root on sys.path)
    REPO_ROOT,
    RssPeak,
    Samples,
    add_common_args,
    console,
    interleaved,
    load_note,
    machine_info,
    paired_ratios,
    print_table,
    timed,
    write_json,
)

import torch  # noqa: E402

from trainer_variants import LABELS, LEARNING_RATE, LORA, MAKERS, Workload, build_workload  # noqa: E402


# ----------------------------------------------------------------------------- memory worker


def memory_worker(variant: str, workload_path: Path, updates: int) -> None:
    """Fresh-process peak memory of `updates` updates of one variant; prints one JSON line."""
    w = Workload.load(workload_path)
    with tempfile.TemporaryDirectory(prefix=f"bench_mem_{variant}_") as tmp:
        update = MAKERS[variant](w, Path(tmp))
        seconds = []
        with RssPeak() as rss:
            for _ in range(updates):
                seconds.append(timed(update))
    print(json.dumps({"variant": variant, **rss.as_dict(), "update_s": seconds}))


def measure_memory(variant: str, workload_path: Path, updates: int, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", variant, "--workload", str(workload_path),
           "--mem-updates", str(updates), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker {variant} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="tasks in the batch (default 2)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task (default 8)")
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward (default 4)")
    parser.add_argument("--hidden", type=int, default=256, help="model width (embedded default 256)")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers (embedded default 4)")
    parser.add_argument("--vocab", type=int, default=2048, help="tokenizer vocabulary (embedded default 2048)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: with 2 on a shared 2-core machine, "
                             "update times varied 5x between repetitions)")
    parser.add_argument("--variants", default=",".join(MAKERS), help=f"comma-separated subset of {list(MAKERS)}")
    parser.add_argument("--mem-updates", type=int, default=1, help="updates per memory subprocess")
    parser.add_argument("--mem-variants", default="ours,trl",
                        help="variants whose memory is measured, each in a fresh process (default ours,trl)")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory runs")
    parser.add_argument("--worker", choices=sorted(MAKERS), help=argparse.SUPPRESS)
    parser.add_argument("--workload", type=Path, help=argparse.SUPPRESS)
    add_common_args(parser, "bench_trainer_vs_trl", reps=3)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    if args.worker:
        memory_worker(args.worker, args.workload, args.mem_updates)
        return
    names = [v for v in args.variants.split(",") if v]
    if not {"ours", "trl"} <= set(names) or not set(names) <= set(MAKERS):
        parser.error(f"--variants must include ours and trl, from {list(MAKERS)}")
    if (args.prompts * args.group_size) % args.micro_batch:
        parser.error("--prompts x --group-size must be a multiple of --micro-batch")

    size = {"hidden": args.hidden, "layers": args.layers, "heads": max(1, args.hidden // 64),
            "kv_heads": max(1, args.hidden // 128), "intermediate": int(args.hidden * 2.75), "vocab": args.vocab}
    cpu = {name: Samples() for name in names}

    def measured(fn: Callable[[], float], name: str) -> Callable[[], float]:
        def run() -> float:
            c0 = time.process_time()
            seconds = timed(fn)
            cpu[name].add(time.process_time() - c0)
            return seconds

        return run

    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        w = build_workload(tmp / "model", args.prompts, args.group_size, args.micro_batch, size)
        workload_path = tmp / "workload.json"
        w.save(workload_path)
        n = len(w.token_ids)
        lengths = [len(ids) for ids in w.token_ids]
        console.print(f"workload: {n} sequences ({args.prompts} prompts x {args.group_size}), {w.tokens} tokens "
                      f"({w.policy_tokens} policy tokens), lengths {min(lengths)}-{max(lengths)}, prompt "
                      f"{min(w.prompt_length)}-{max(w.prompt_length)}; built in {time.perf_counter() - t0:.1f} s; "
                      f"torch threads {torch.get_num_threads()}")
        updates = {name: MAKERS[name](w, tmp) for name in names}
        first_loss = {name: fn() for name, fn in updates.items()}  # also the first warm-up
        console.print("first-update loss (same batch, on-policy, should agree): "
                      + ", ".join(f"{k} {v:.6f}" for k, v in first_loss.items()))
        seconds = interleaved(
            {name: measured(fn, name) for name, fn in updates.items()}, args.reps,
            warmup=max(0, args.warmup - 1),
            on_rep=lambda rep, v: console.print(f"  rep {rep + 1}: " + ", ".join(
                f"{k} {s:.2f} s ({w.tokens / s:,.0f} tok/s)" for k, s in v.items())),
        )
        del updates
        memory = {} if args.no_memory else {
            name: measure_memory(name, workload_path, args.mem_updates, args.threads)
            for name in names if name in args.mem_variants.split(",")
        }

    machine = machine_info()
    rows: list[list[Any]] = []
    results: dict[str, Any] = {
        "workload": {"sequences": n, "tokens": w.tokens, "policy_tokens": w.policy_tokens,
                     "min_len": min(lengths), "max_len": max(lengths), "prompt_len": max(w.prompt_length)},
        "first_update_loss": first_loss, "variants": {},
    }
    for name in ["trl", *[v for v in names if v != "trl"]]:
        s = seconds[name]
        speedup = paired_ratios(seconds["trl"], s)  # TRL time / this time = this tokens/s over TRL's
        mem = memory.get(name, {})
        rows.append([LABELS[name], s.median, w.tokens / s.median, speedup.median, cpu[name].median,
                     mem.get("delta_mib", float("nan")), mem.get("peak_mib", float("nan"))])
        results["variants"][name] = {
            "update_s": s.summary(), "cpu_s": cpu[name].summary(), "tokens_per_s": w.tokens / s.median,
            "tokens_per_s_vs_trl": speedup.summary(), "memory": mem,
        }
    results["tokens_per_s_ratio_ours_over_trl"] = results["variants"]["ours"]["tokens_per_s_vs_trl"]["median"]
    if "ours" in memory and "trl" in memory:
        results["update_memory_ratio_ours_over_trl"] = memory["ours"]["delta_mib"] / memory["trl"]["delta_mib"]
    print_table(
        "Trainer: one GRPO update (LoRA, same batch; medians)",
        ["variant", "s / update", "tokens / s", "tokens/s vs TRL", "CPU s", "update RSS peak (MiB)",
         "process peak (MiB)"],
        rows,
        caption=f"{n} seqs, {w.tokens} tokens, micro-batch {args.micro_batch}, {args.threads} thread(s), "
                f"{args.reps} reps; memory: fresh process each, {args.mem_updates} update(s); {load_note(machine)}",
    )
    settings = {"prompts": args.prompts, "group_size": args.group_size, "micro_batch": args.micro_batch,
                "model": size, "lora": LORA, "learning_rate": LEARNING_RATE, "reps": args.reps,
                "mem_updates": args.mem_updates, "mem_variants": args.mem_variants.split(","),
                "torch_threads": args.threads, "variants": names}
    path = write_json(args.json_out, "bench_trainer_vs_trl", settings, results, machine)
    if path:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
