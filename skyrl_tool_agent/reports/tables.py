"""A run's tables: the before/after record and table (printed at the end, and metrics_table.md
during the run), the model card and the optional Hub upload."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.eval.anatomy import CATEGORIES, LABELS, anatomy_deltas
from skyrl_tool_agent.eval.metrics import HEADLINE_KEYS, format_rate
from skyrl_tool_agent.eval.stats import paired_delta
from skyrl_tool_agent.eval.vocabulary import vocabulary

logger = logging.getLogger(__name__)


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]], console: Any = None) -> None:
    """A rich table on `console` (default: a new one): the first column left-aligned (labels), the others right."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    (console or Console()).print(table)


def print_before_after(summary: Any) -> None:
    from rich.console import Console

    words = vocabulary(getattr(summary, "family", "sql"))  # SQL words only for SQL
    n = int(summary.before.get("n", 0))
    # The title on its own line: as a table title it would wrap to the (narrow) table's width.
    print_split(f"Held-out tasks (training.eval_split), greedy (n={n}) — {summary.steps} GRPO steps, "
                f"{summary.seconds / 60:.1f} min", summary.before, summary.after,
                {"execution_accuracy_delta": summary.delta, "avg_at_k_delta": summary.sampled_delta}, words)
    if rows := anatomy_rows(summary.before, summary.after, summary.anatomy_delta):
        print_table("Why answers are wrong (greedy, the same tasks)",
                    ("error", "before GRPO", "after GRPO", "change of its rate [95% paired bootstrap]"), rows)
    if summary.test:
        test = summary.test
        print_split(f"Test split (in-family, never trained or tuned on), greedy (n={int(test['before'].get('n', 0))})",
                    test["before"], test["after"], test, words)
    if summary.stop_reason:
        Console().print(f"training stopped: {summary.stop_reason}")
    Console().print(f"outputs: {summary.output_dir} (report.html, metrics.jsonl, training_curves.png, final/)")


def print_split(title: str, before: dict[str, Any], after: dict[str, Any], deltas: dict[str, Any], words: Any) -> None:
    """One split's before/after table and the sentences of its changes (`split_record`'s deltas)."""
    from rich.console import Console

    Console().print(title)
    print_table(None, ("metric", "before GRPO", "after GRPO", "delta"), metric_rows(before, after, words))
    Console().print(delta_sentence(deltas.get("execution_accuracy_delta"), before, after, label=words.accuracy_label))
    sampled = before.get("sampled")
    if sampled and after.get("sampled"):
        Console().print(delta_sentence(deltas.get("avg_at_k_delta"), before, after,
                                       label=f"avg@{sampled['k']} (T={sampled['temperature']:g})"))


def metric_rows(before: dict[str, Any], after: dict[str, Any], words: Any) -> list[tuple[str, str, str, str]]:
    """(label, before, after, change) of the headline metrics, what every rate is over (scored,
    infra errors: no change) and the sampled rows: the before/after table, printed or in Markdown."""
    def rate(label: str, b: float | None, a: float | None) -> tuple[str, str, str, str]:
        return label, format_rate(b), format_rate(a), "n/a" if a is None or b is None else f"{a - b:+.3f}"

    rows = [rate(words.accuracy if key == "execution_accuracy" else key, before[key], after[key])
            for key in HEADLINE_KEYS if key in before and key in after]
    rows += [(key, f"{before.get(key, 0):.0f}", f"{after.get(key, 0):.0f}", "") for key in ("scored", "infra_errors")
             if key in before or key in after]
    return rows + [rate(*row) for row in sampled_rows(before, after)]


def sampled_rows(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """The sampled evaluation's rows (`training.eval_samples`): avg@k and pass@k at the training
    temperature, before and after; none when either evaluation did not sample."""
    b, a = before.get("sampled"), after.get("sampled")
    if not b or not a:
        return []
    k, temp = b["k"], b["temperature"]
    return [(f"avg@{k} (T={temp:g})", b["avg@k"], a["avg@k"]), (f"pass@{k} (T={temp:g})", b["pass@k"], a["pass@k"])]


def anatomy_rows(before: dict[str, Any], after: dict[str, Any],
                 deltas: dict[str, dict[str, float]] | None) -> list[tuple[str, str, str, str]]:
    """(label, count before, count after, 'change [low, high]' in points) per error category
    (`eval.anatomy`); none when either evaluation lacks the anatomy."""
    b, a = before.get("error_anatomy"), after.get("error_anatomy")
    if not b or not a:
        return []
    rows = []
    for c in CATEGORIES:
        d = (deltas or {}).get(c)
        change = (f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]" if d else "n/a")
        rows.append((LABELS[c], str(b["counts"].get(c, 0)), str(a["counts"].get(c, 0)), change))
    rows.append(("wrong in all", str(b.get("wrong", 0)), str(a.get("wrong", 0)), ""))
    return rows


def delta_sentence(delta: dict[str, Any] | None, before: dict[str, Any], after: dict[str, Any], *,
                   label: str = "execution accuracy") -> str:
    """The change of the headline (`label`) with its interval and what it is over, or why there is none."""
    lost = f"{before.get('infra_errors', 0):.0f} before / {after.get('infra_errors', 0):.0f} after"
    if not delta:
        return (f"{label} change: not measured (no task scored both before and after; "
                f"infra errors {lost})")
    return (f"{label} change: {100 * delta['delta']:+.1f} points, "
            f"{100 * delta['confidence']:.0f}% paired-bootstrap interval "
            f"[{100 * delta['low']:+.1f}, {100 * delta['high']:+.1f}] over {delta['n']} tasks scored both times "
            f"({delta.get('unscored', 0)} left out as unscored; infra errors {lost})")


def push_to_hub(folder: Path, repo_id: str, *, private: bool = True) -> str:
    """Upload a saved adapter/model folder with `huggingface_hub.HfApi`, creating the repo if needed."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="skyrl-tool-agent GRPO")
    logger.info("pushed %s to %s", folder, repo_id)
    return str(info)


def before_after_markdown(record: dict[str, Any], words: Any, *, after_label: str = "after GRPO") -> str:
    """The before/after table of `record` (before_after.json's fields) in Markdown: the headline
    metrics, what they are over, avg@k and pass@k, the changes with their intervals and why
    answers are wrong; `after_label` names the second column. `words`: the family's vocabulary."""
    before, after, delta = record["before"], record["after"], record.get("execution_accuracy_delta")
    rows = "\n".join(f"| {label} | {b} | {a} |" for label, b, a, _ in metric_rows(before, after, words))
    change = f"\n{delta_sentence(delta, before, after, label=words.accuracy_label).capitalize()}.\n"
    if record.get("avg_at_k_delta"):
        k = before["sampled"]["k"]
        change += f"{delta_sentence(record['avg_at_k_delta'], before, after, label=f'avg@{k}').capitalize()}.\n"
    errors = anatomy_rows(before, after, record.get("error_anatomy_delta"))
    if errors:
        change += (f"\nWhy answers are wrong (each wrong answer against its gold query; change of the rate in "
                   f"points, 95% paired bootstrap):\n\n| error | before GRPO | {after_label} | change |\n|---|---|---|---|\n"
                   + "\n".join(f"| {' | '.join(row)} |" for row in errors) + "\n")
    return f"| metric | before GRPO | {after_label} |\n|---|---|---|\n{rows}\n{change}"


def write_metrics_table(path: Path, record: dict[str, Any], words: Any, *, state: str, split: str,
                        after_label: str) -> Path:
    """`path` (metrics_table.md): `before_after_markdown` under the run's `state` in words, and the
    test split's (`record["test"]`, at the end of a run that evaluated it), replaced atomically (a
    run rewrites it after each evaluation and probe)."""
    from skyrl_tool_agent.reports.atomic import write_text_atomically

    def tasks(r: dict[str, Any]) -> str:
        n = r["before"].get("n")
        return f"{n:.0f} tasks" if isinstance(n, (int, float)) else "tasks"

    text = (f"# GRPO run: {state}\n\nGreedy on the `{split}` split ({tasks(record)}), the same tasks each time.\n\n"
            + before_after_markdown(record, words, after_label=after_label))
    if test := record.get("test"):
        text += (f"\n## The test split ({tasks(test)}: in-family, never trained or tuned on)\n\n"
                 + before_after_markdown(test, words, after_label=after_label))
    return write_text_atomically(path, text)


def write_model_card(folder: Path, config: Any, record: dict[str, Any]) -> Path:
    """`folder/README.md`: a model card for a trained policy (replacing peft's empty template) with
    the base model, the data, the reward, the training settings and the before/after evaluation of
    `record` (before_after.json). Written with huggingface_hub's ModelCard, so the Hub reads it."""
    from huggingface_hub import ModelCard, ModelCardData

    from skyrl_tool_agent.config import EMBEDDED
    from skyrl_tool_agent.env.families import resolve_family
    from skyrl_tool_agent.eval.splits import train_pool_kind
    from skyrl_tool_agent.rewards.rubric import Rubric

    m, t, g = config.model, config.training, config.grpo
    words = vocabulary(resolve_family(config.env.task_family).name)  # SQL words only for SQL
    embedded = m.name_or_path == EMBEDDED
    base = "the embedded 3.5M-parameter Qwen2 shipped with skyrl-tool-agent (warm-started)" if embedded else m.name_or_path
    data = ModelCardData(
        base_model=None if embedded or Path(m.name_or_path).exists() else m.name_or_path,
        library_name="peft" if t.mode == "lora" else "transformers",
        pipeline_tag="text-generation",
        tags=["skyrl-tool-agent", "grpo", "reinforcement-learning", *(["text-to-sql"] if words.sql else []), "mcp",
              "tool-use", *(["lora"] if t.mode == "lora" else [])],
    )
    before = record["before"]
    what, tools, answer = (("Text-to-SQL agent", "SQLite tools", "SQL") if words.sql else
                           (f"Tool-using agent for the `{words.family}` tasks", "tools", "its final answer"))
    test = record.get("test")
    test_markdown = (f"## The test split (greedy, {test['before'].get('n', 0):.0f} in-family tasks never trained or "
                     f"tuned on)\n\n{before_after_markdown(test, words)}\n" if test else "")
    body = f"""
# {what} trained with GRPO over MCP tools

A multi-turn tool-using policy trained with skyrl-tool-agent's GRPO: it calls
{tools} served over the Model Context Protocol and ends with `<answer>{answer}</answer>`.

- **Base model:** {base}
- **Training:** {t.mode}{f" (LoRA r={m.lora.r}, alpha={m.lora.alpha})" if t.mode == "lora" else ""}, {record["steps"]} GRPO steps
  ({record["training_minutes"]:.1f} min; {record["stop_reason"]}), {t.tasks_per_step} tasks x {g.group_size} episodes
  per step at temperature {g.temperature}, learning rate {t.learning_rate:g}, KL coefficient {g.kl_coef:g},
  advantage `{g.advantage_estimator}`, loss aggregation `{g.loss_aggregation}`, seed {t.seed}
- **Data:** `{t.data.dataset}` tasks (training pool: `{train_pool_kind(config)}`), tool-call format
  `{config.env.tool_call_format}`, at most {g.max_turns} turns
- **Reward:** {Rubric.from_specs(config.env.reward.terms).describe()}

## Evaluation (greedy, `{t.eval_split}` split, {before.get("n", "?"):.0f} tasks)

{before_after_markdown(record, words)}
{test_markdown}The full record (per-task outcomes, training curves) is in the run directory: `before_after.json`,
`metrics.jsonl`, `training_curves.png`, `rollouts.jsonl`.
"""
    path = folder / "README.md"
    ModelCard(f"---\n{data.to_yaml()}\n---\n{body}").save(path)
    return path


@dataclass
class RunSummary:
    before: dict[str, Any]
    after: dict[str, Any]
    steps: int
    seconds: float
    output_dir: Path
    stop_reason: str = ""
    #: Execution-accuracy change on the eval tasks with its paired-bootstrap 95% interval.
    delta: dict[str, float] | None = None
    #: The task family (`TaskFamily.name`): the end-of-run table speaks its words.
    family: str = "sql"
    #: The avg@k change (training.eval_samples) with its paired-bootstrap 95% interval.
    sampled_delta: dict[str, float] | None = None
    #: Each error category's rate change (`eval.anatomy`) with its paired-bootstrap 95% interval.
    anatomy_delta: dict[str, dict[str, float]] | None = None
    #: The test split's `split_record` (`training.test_eval`), None where it was not evaluated.
    test: dict[str, Any] | None = None


def split_record(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Two evaluations of one split's tasks and the paired-bootstrap intervals of their changes:
    EX when both carry per-task outcomes, avg@k when both sampled, each error category's rate when
    both carry the error anatomy."""
    return {"before": before, "after": after,
            "execution_accuracy_delta": paired_delta(before.get("solved"), after.get("solved")),
            "avg_at_k_delta": paired_delta((before.get("sampled") or {}).get("per_task"),
                                           (after.get("sampled") or {}).get("per_task")),
            "error_anatomy_delta": anatomy_deltas(before, after)}


def before_after_record(before: dict[str, Any], after: dict[str, Any], steps: int, *, stop_reason: str,
                        training_seconds: float, test: dict[str, Any] | None = None) -> dict[str, Any]:
    """before_after.json's record: the eval split's `split_record`, the steps, the stop reason, the
    minutes, and `test` (the test split's `split_record`) where the run evaluated it."""
    return {**split_record(before, after), "steps": steps, "stop_reason": stop_reason,
            "training_minutes": training_seconds / 60, **({"test": test} if test else {})}
