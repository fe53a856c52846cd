"""Does GRPO on databases the policy never saw teach it to copy the question's constants? (issue 58,
item 3: a lever chosen on validation). Builds, under OUT:

- `db58101/`: the built-in databases from generator seed 58_101, and `fresh_train.json`: every slot
  assignment of the built-in templates there (all paraphrases) that no known task shares a question
  or gold query with (train, pool, validation, dev, test): new constants, so copying the question's
  is the only way to be right;
- `db58201/` and `fresh_validation.json`: 256 such tasks on seed 58_201's databases, chosen like the
  test split (`generated_test_split`): a validation split for this lever, in-family and clean of the
  test split (whose databases are seed 58_001's) and of everything above.

Then prints the commands the lab notebook ran (a fixed number of steps, so load changes only the
time): the arm trains on `fresh_train.json` (`train_pool=file`, `db_root` = seed 58_101's); the
control is the main job's `final/`; both are evaluated at avg@4 on `fresh_validation.json` and on
the generated pool's validation split, and compared per task with `paired_bootstrap`.
Not a unit test. Result: benchmarks/results/issue58_new_databases.json, drawn by `--plot` into the
PNG beside it.

    python benchmarks/new_databases_arm.py --out /tmp/exp58
    python benchmarks/new_databases_arm.py --plot benchmarks/results/issue58_new_databases.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from skyrl_tool_agent.config.loader import load_config
from skyrl_tool_agent.data.builtin.domains import DOMAINS
from skyrl_tool_agent.data.builtin.pool import template_difficulty, template_groups
from skyrl_tool_agent.data.builtin.schema import create_database
from skyrl_tool_agent.data.builtin.test_split import generated_test_split
from skyrl_tool_agent.data.tasks import Task, db_path_for, save_tasks
from skyrl_tool_agent.eval.splits import TaskSplits

TRAIN_SEED, VALIDATION_SEED = 58_101, 58_201


def databases(out: Path, seed: int) -> Path:
    root = out / f"db{seed}"
    if not root.is_dir():
        for domain in DOMAINS:
            create_database(domain, db_path_for(root, domain.db_id), seed)
    return root


def plot(results_json: Path) -> Path:
    """Each model's avg@4 change from the start on both splits, with its paired interval, beside the JSON."""
    import json

    from skyrl_tool_agent.reports.plots import plt, save_figure  # pyplot on the headless backend

    changes = json.loads(results_json.read_text())["change_vs_start"]
    names = list(changes)
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(names) + 1.8), sharey=True)
    for ax, split in zip(axes, ("fresh_validation", "validation")):
        for y, name in enumerate(names):
            d = changes[name][split]
            ax.errorbar(100 * d["delta"], y, xerr=[[100 * (d["delta"] - d["low"])], [100 * (d["high"] - d["delta"])]],
                        fmt="o", capsize=3, color="#c44e52" if name.startswith("new_databases") else "#4c72b0")
        ax.axvline(0, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"{split.replace('_', ' ')} (avg@4)", fontsize=9)
        ax.set_xlabel("change from the start, points (95% paired bootstrap)", fontsize=8)
        ax.grid(alpha=0.3, axis="x")
    axes[0].set_yticks(range(len(names)), [n.replace("_", " ") for n in names], fontsize=8)
    axes[0].invert_yaxis()
    return save_figure(fig, results_json.with_suffix(".png"), dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, help="where the databases and task files go")
    parser.add_argument("--plot", type=Path, help="draw this results JSON into a PNG beside it, and stop")
    args = parser.parse_args()
    if args.plot is not None:
        print(plot(args.plot))
        return
    if args.out is None:
        parser.error("--out or --plot is needed")
    out = args.out
    splits = TaskSplits.load(load_config())
    pool, validation = splits.pool_and_validation()
    known = [*splits.train, *pool, *validation, *splits.dev, *splits.test()]
    train_root, validation_root = databases(out, TRAIN_SEED), databases(out, VALIDATION_SEED)
    fresh_validation = [t.model_copy(update={"task_id": t.task_id.replace("test", "fval"), "split": "validation"})
                        for t in generated_test_split(validation_root, known, 256)]
    save_tasks(fresh_validation, out / "fresh_validation.json")
    fresh_train: list[Task] = []
    for group, fresh in template_groups(train_root, [*known, *fresh_validation], "fresh-train"):
        for inst in group if fresh else ():
            fresh_train.append(Task(task_id=f"builtin-fresh-{len(fresh_train):05d}", db_id=inst.db_id,
                                    question=inst.question, gold_sql=inst.gold_sql,
                                    difficulty=template_difficulty(inst), source="builtin", split="train",
                                    template_id=inst.template_id))
    save_tasks(fresh_train, out / "fresh_train.json")
    print(f"{len(fresh_train)} training tasks ({len({t.gold_sql for t in fresh_train})} queries), "
          f"{len(fresh_validation)} validation tasks\n")
    fixed = ("--max-steps 160 --set training.time_budget_minutes=null --set training.job_budget_minutes=null "
             "--set training.eval_num_tasks=16 --set training.eval_samples=0 --set training.test_eval=false "
             "--set training.probe_tasks=0 --set training.probe_held_out_tasks=0")
    print(f"python training/scripts/train_grpo.py --mode lora {fixed} --set training.data.train_pool=file "
          f"--set training.data.train_file={out}/fresh_train.json --set training.data.db_root={train_root} "
          f"--output-dir {out}/arm")
    for name, split in (("fresh validation", f"--split train --set training.data.train_file={out}/fresh_validation.json "
                                             f"--set training.data.db_root={validation_root}"),
                        ("validation", "--split validation")):
        print(f"# {name}, the start, the arm and the main job's final/ (--model-path):\n"
              f"skyrl-tool-agent eval --policy model [--model-path DIR/final] --num-samples 4 --temperature 1.0 {split} "
              "--output-dir EVAL_DIR --no-report")


if __name__ == "__main__":
    main()
