"""The "Training rollouts" view of report.html: a training run's `rollouts.jsonl`, grouped by step,
filtered, searched and sorted in the page (`templates`: its JS).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.databases import name_problem, shown_name
from skyrl_tool_agent.data.json_input import JsonNestingError, loads_bounded
from skyrl_tool_agent.data.validation import IDENTIFIER_MAX_CHARS
from skyrl_tool_agent.eval.metrics import group_by
from skyrl_tool_agent.reports.episodes import ResultPreviewer, episode, shared_system_prompt

logger = logging.getLogger(__name__)

#: The file a training run writes into its output directory.
ROLLOUTS_FILE = "rollouts.jsonl"

_Identifier = Annotated[str, Field(max_length=IDENTIFIER_MAX_CHARS)]
_Count = Annotated[int, Field(ge=0)]


class RolloutMessage(BaseModel):
    """One chat message of a rollout (role and text; tool-call fields and the like pass through)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | None = None


class RolloutRecord(BaseModel):
    """A line of rollouts.jsonl: the fields the report reads, typed; others pass through."""

    model_config = ConfigDict(extra="allow")

    step: _Count
    task_id: _Identifier
    db_id: _Identifier = ""
    difficulty: str | None = None
    question: str = ""
    gold_sql: str | None = None
    ground_truth: str | None = None
    final_sql: str | None = None
    solved: bool = False
    reward: float | None = None
    reward_terms: dict[str, float | None] | None = None
    advantage: float | None = None
    used_in_update: bool = False
    group: _Count | None = None
    group_member: _Count | None = None
    turns: _Count | None = None
    tool_calls: _Count | None = None
    done_reason: str | None = None
    messages: list[RolloutMessage] = []

    @field_validator("db_id")
    @classmethod
    def _a_database_name(cls, db_id: str) -> str:
        # Training writes a name from its database root: a path, a NUL byte or an endless name is crafted.
        if db_id and (problem := name_problem(db_id)) is not None:
            raise ValueError(f"db_id {shown_name(db_id)} {problem}")
        return db_id


def _record_problem(exc: ValidationError) -> str:
    """pydantic's first complaint about a rollout record, in a few words."""
    error = exc.errors()[0]
    name = ".".join(str(p) for p in error.get("loc", ())) or "record"
    if error.get("type") == "missing":
        return f"no field '{name}'"
    return f"field '{name}': {error.get('msg', error.get('type', ''))}"


def load_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """The records of a rollouts.jsonl (UserInputError if missing or not one, or at the first line
    that is not a rollout record: one line naming the file and the line). A last line cut off (a
    run still writing) is skipped with a warning."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise UserInputError(f"rollouts file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"rollouts file {path} cannot be read ({exc})") from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = loads_bounded(line)
        except JsonNestingError as exc:
            raise UserInputError(f"rollouts file {path}: line {number}: {exc}") from None
        except json.JSONDecodeError as exc:
            if number == len(lines):
                logger.warning("%s: line %d is incomplete (a run still writing?); skipped", path, number)
                continue
            raise UserInputError(f"rollouts file {path}: line {number} is not JSON ({exc})") from exc
        if not isinstance(record, dict) or "step" not in record or "task_id" not in record:
            raise UserInputError(f"rollouts file {path}: line {number} is not a rollout record (no step/task_id)")
        try:
            checked = RolloutRecord.model_validate(record)
        except ValidationError as exc:
            raise UserInputError(f"rollouts file {path}: line {number} is not a rollout record "
                                 f"({_record_problem(exc)})") from None
        records.append(checked.model_dump(exclude_unset=True))
    return records


def _step(record: Mapping[str, Any]) -> int:
    step = record.get("step")
    return int(step) if isinstance(step, (int, float)) else 0


def _mean(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return mean(numbers) if numbers else None


def side_by_side(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The GRPO groups of the rollouts (episodes of one task at one step, two or more), each as
    columns of its members: reward, advantage, solved, used in the update, each reward term and
    the final answer, so what set the advantages apart can be read across."""
    groups = group_by(records, lambda r: (_step(r), str(r.get("task_id"))))
    out = []
    for (step, task_id), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        members = sorted(members, key=lambda r: int(r.get("group_member") or 0))
        terms = list(dict.fromkeys(k for r in members for k in (r.get("reward_terms") or {})))
        rewards = [float(r["reward"]) for r in members if isinstance(r.get("reward"), (int, float))]
        first = members[0]
        out.append({
            "step": step, "task_id": task_id, "question": str(first.get("question", "")),
            "gold": str(first.get("gold_sql", first.get("ground_truth", ""))), "terms": terms,
            "solved": sum(bool(r.get("solved")) for r in members),
            "low": min(rewards, default=None), "high": max(rewards, default=None),
            "members": [{"member": r.get("group_member", "?"), "reward": r.get("reward"), "advantage": r.get("advantage"),
                         "solved": bool(r.get("solved")), "used": bool(r.get("used_in_update")),
                         "terms": dict(r.get("reward_terms") or {}), "final": r.get("final_sql")} for r in members],
        })
    return out


def rollouts_view(records: Sequence[Mapping[str, Any]], previewer: ResultPreviewer) -> dict[str, Any]:
    """The view's data: per-step groups (with their counts and means), the episodes, filter options."""
    system_prompt = shared_system_prompt(r.get("messages") or [] for r in records)
    by_step = group_by(records, _step)
    groups, items = [], []
    for step in sorted(by_step):
        members = by_step[step]
        group: dict[str, Any] = {
            "step": step, "n": len(members), "solved": sum(bool(r.get("solved")) for r in members),
            "reward": _mean([r.get("reward") for r in members]), "advantage": _mean([r.get("advantage") for r in members]),
            "used": sum(bool(r.get("used_in_update")) for r in members), "episodes": [],
        }
        groups.append(group)
        for record in members:
            advantage = record.get("advantage")
            outcome = (f"{record.get('done_reason', '?')}, {record.get('turns', 0)} turns, "
                       f"{record.get('tool_calls', 0)} tool calls")
            facts = [("step", str(step)), ("advantage", f"{advantage:+.3f}" if isinstance(advantage, (int, float)) else "-"),
                     ("used in the update", "yes" if record.get("used_in_update") else "no"),
                     ("outcome", outcome)]
            group["episodes"].append(episode(
                f"r{len(items)}", record, record, system_prompt=system_prompt, previewer=previewer, facts=facts,
                tags=[f"step {step}", f"member {record.get('group_member', '?')}"],
                data={"step": str(step), "advantage": advantage}))
            items.append(group["episodes"][-1])
    steps = sorted(by_step)
    return {
        "side_by_side": side_by_side(records),
        "episodes": items,
        "groups": groups,
        "dbs": sorted({str(r.get("db_id", "")) for r in records}),
        "first_step": steps[0] if steps else 0,
        "last_step": steps[-1] if steps else 0,
        "solved": sum(bool(r.get("solved")) for r in records),
        "system_prompt": system_prompt,
    }
