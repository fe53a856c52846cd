"""Bring your own task family in one Python file: `--task-file my_task.py` on train and eval.

The file declares, at module level:

- `TOOLS`: plain functions (type-annotated parameters, a docstring each); the project serves them
  as a real MCP stdio server (`mcp_tools.one_file_server`), under the SQL tools' limits: a result
  over 64 KiB is answered `too large: ...`, a call longer than 0.8 x `env.call_timeout_s` is
  answered `timeout: ...` (the model reads both);
- `TASKS`: a list of `{task_id, question, ground_truth, difficulty}` (or the path of a JSON file
  of them, relative to the file);
- the verdict: a reward term, `def correct(episode) -> float` (1 = solved;
  `skyrl_tool_agent.rewards.terms.Episode`: `episode.answer`, `episode.ground_truth`);
- `FAMILY = TaskFamily(name=..., system_prompt=..., verdict_term="correct")`.

`task_file_overrides` turns the file into the config (`--set`) that the five-file way spells out
(configs/examples/inventory.yaml): the family, its server, its reward (the verdict, plus a 0.1
`format` term), its tasks as the train and dev files; later `--set`s win. Nothing goes on
PYTHONPATH. examples/price_lookup.py (in a checkout) is a complete example.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.env.families import TaskFamily, resolve_family

__all__ = ["task_file_overrides"]


def _tasks_file(path: Path, tasks: object) -> Path:
    """The file's TASKS as a task file: the JSON file it names, or the list written once (by content)."""
    if isinstance(tasks, (str, Path)):
        return (path.parent / tasks).resolve()
    if not isinstance(tasks, list) or not tasks:
        raise UserInputError(f"{path}: TASKS must be a non-empty list of task records, or a JSON file's path")
    text = json.dumps(tasks, indent=1, ensure_ascii=False) + "\n"
    out = Path(tempfile.gettempdir()) / "skyrl-tool-agent-tasks" / f"{path.stem}-{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_suffix(f".{id(text)}.tmp")
        staging.write_text(text, encoding="utf-8")
        staging.replace(out)
    return out


def task_file_overrides(task_file: str | Path) -> list[str]:
    """`--set` overrides that run the one-file family at `task_file` (module doc)."""
    path = Path(task_file).expanduser().resolve()
    if not path.is_file() or path.suffix != ".py":
        raise UserInputError(f"--task-file {task_file}: no such Python file")
    family = resolve_family(f"{path}:FAMILY")  # loads the file once (a broken one: one error line)
    assert isinstance(family, TaskFamily)
    from skyrl_tool_agent.config.user_code import load_module_file

    module = load_module_file(path)
    for name in ("TOOLS", "TASKS"):
        if not getattr(module, name, None):
            raise UserInputError(f"--task-file {path}: it defines no {name} (module doc of skyrl_tool_agent.examples.one_file)")
    tasks = _tasks_file(path, module.TASKS)
    server = {"name": family.name, "command": sys.executable, "args": ["-m", "mcp_tools.one_file_server", str(path)]}
    terms = [{"name": family.verdict_term, "weight": 1.0, "function": f"{path}:{family.verdict_term}"},
             {"name": "format", "weight": 0.1}]
    values = {
        "env.task_family": f"{path}:FAMILY", "env.mcp_servers": [server], "env.offered_tools": None,
        "env.schema_in_prompt": False, "env.bind_db_id": False, "env.reward.terms": terms,
        "training.data.train_file": str(tasks), "training.data.dev_file": str(tasks), "training.data.train_pool": "file",
    }
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]
