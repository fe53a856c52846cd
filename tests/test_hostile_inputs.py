"""Issue 35: crafted data files, report inputs and checkpoints are refused in one line naming the file
and the record (or line), with no traceback, no database read outside the database root and no
checkpoint file read through a link that leaves the checkpoint.

- task files, through the load-time check and the real `eval` CLI: JSON nested past
  `MAX_JSON_NESTING` (a RecursionError before), a field over its size (a 4 kB db_id reached the file
  system as `OSError: File name too long`; a 1 MB source was accepted), a NUL byte in db_id (an
  error that named neither file nor record), a db_id too long in bytes for a file name, a control
  character in an identifier;
- report inputs: the result previewer asked for an absolute db_id, `../x` or a link out of the root
  (it printed the rows of a database outside the root); rollouts records with a text group member
  (a ValueError while writing the report), JSON nested too deep, a path as db_id, a reward too
  large for a float, a message that is not an object; and the real `eval --rollouts` with the
  absolute db_id;
- checkpoints: a file or the manifest linked to a file outside the checkpoint (followed by
  `--resume`), and a 10 GB sparse file (hashed for 20-40 s before its refusal).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.validation import BadRecordsError, load_checked_tasks, read_task_file
from skyrl_tool_agent.reports.rollouts import load_rollouts
from skyrl_tool_agent.reports.episodes import ResultPreviewer
from tests.fixtures.config_files import REPO

GOOD = {"task_id": "t-0", "db_id": "shop", "question": "How many items?", "gold_sql": "SELECT count(*) FROM items",
        "difficulty": "easy"}
SECRET = "TOPSECRET-35"


def _database(path: Path, table: str = "items", value: str = "a") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE {table} (v TEXT)")
        conn.executemany(f"INSERT INTO {table} VALUES (?)", [(value,), (value,)])
    conn.close()
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="offline", WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false", COLUMNS="300")
    return subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(errors[0]) < 600, done.stderr[-3000:]
    return errors[0]


# ------------------------------------------------------------------------------------------- task files

#: (record 1 of a task file after GOOD, words its error line must hold)
BAD_RECORDS = [
    pytest.param({**GOOD, "db_id": "a" * 4096}, "db_id of 4,096 characters (at most 200)", id="db_id-4kB"),
    pytest.param({**GOOD, "db_id": "sh\x00op"}, "db_id 'sh\\x00op' holds a NUL character", id="db_id-NUL"),
    pytest.param({**GOOD, "db_id": "é" * 130}, "is 260 bytes long; a database file name <db_id>.sqlite has at most 255",
                 id="db_id-too-long-for-a-file-name"),
    pytest.param({**GOOD, "source": "s" * 1_000_000}, "source of 1,000,000 characters (at most 200)", id="source-1MB"),
    pytest.param({**GOOD, "task_id": "t-1\nerror: forged"}, "field 'task_id' holds a control character (U+000A",
                 id="task_id-newline"),
]
#: A task file whose JSON nests too deep: (its text after GOOD's record, the record it names)
NESTED = [
    pytest.param(lambda: "[" * 100_000 + "]" * 100_000, "record 0", id="a-list-of-lists"),
    pytest.param(lambda: json.dumps([GOOD])[:-1] + ', {"task_id": "t-1", "question": ' + "[" * 5_000 + "]" * 5_000 + "}]",
                 "record 1", id="in-a-field"),
    pytest.param(lambda: json.dumps([GOOD, GOOD])[:-1] + ", " + '{"a": ' * 5_000 + "1" + "}" * 5_000 + "]",
                 "record 2", id="objects"),
]


def _numbered(record: dict, index: int) -> dict:
    """`record` as record `index` of a file: its own task_id when it sets one, else `t-<index>`."""
    return record if record["task_id"] != GOOD["task_id"] else {**record, "task_id": f"t-{index}"}


def _task_file(tmp_path: Path, records: list[dict]) -> tuple[Path, Path]:
    """(task file of `records`, database root with the `shop` database GOOD names)."""
    root = tmp_path / "dbs"
    _database(root / "shop" / "shop.sqlite")
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return tasks, root


@pytest.mark.parametrize(("record", "why"), BAD_RECORDS)
def test_bad_record_is_refused_naming_file_and_record(tmp_path, record, why):
    tasks, root = _task_file(tmp_path, [GOOD, _numbered(record, 1)])
    with pytest.raises(BadRecordsError) as caught:
        load_checked_tasks(tasks, db_root=root)
    line = str(caught.value)
    assert line.startswith(f"{tasks}: record 1 (") and why in line, line
    assert "\n" not in line and len(line) < 500


@pytest.mark.parametrize(("text", "where"), NESTED)
def test_json_nested_too_deep_is_refused_naming_file_and_record(tmp_path, text, where):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(text())
    with pytest.raises(ValueError) as caught:
        read_task_file(tasks)
    assert str(caught.value) == (f"{tasks}: {where}: JSON nested more than 32 levels deep (a task record has 2); "
                                 "the file cannot be read past it")


@pytest.mark.parametrize("case", ["bad-records", "nested"])
def test_eval_cli_refuses_a_hostile_task_file_in_one_line(tmp_path, case):
    """The real `eval` process: exit 2, one `error:` line naming the file and the record, nothing run."""
    tasks, root = _task_file(tmp_path, [GOOD, *(_numbered(p.values[0], i) for i, p in enumerate(BAD_RECORDS, 1))])
    if case == "nested":
        tasks.write_text(NESTED[1].values[0]())
    done = _cli("eval", "--policy", "oracle", "--output-dir", str(tmp_path / "eval"),
                "--set", f"training.data.train_file={tasks}", "--set", f"training.data.dev_file={tasks}",
                "--set", f"training.data.db_root={root}")
    line = _one_error_line(done)
    if case == "nested":
        assert line == (f"error: {tasks}: record 1: JSON nested more than 32 levels deep (a task record has 2); the "
                        "file cannot be read past it")
    else:
        assert line.startswith(f"error: {tasks}: record 1 (t-1): db_id of 4,096 characters (at most 200) "
                               f"(and {len(BAD_RECORDS) - 1} more bad records)"), line
    assert not (tmp_path / "eval").exists()


# ------------------------------------------------------------------------------------------- report inputs


@pytest.mark.parametrize("db_id", ["absolute", "../outside", "link"])
def test_result_previewer_reads_no_database_outside_the_root(tmp_path, db_id):
    root = tmp_path / "dbs"
    _database(root / "shop" / "shop.sqlite")
    _database(tmp_path / "outside" / "outside.sqlite", "s", SECRET)  # what ../outside reaches
    _database(tmp_path / "outside.sqlite", "s", SECRET)  # what an absolute db_id reached (it replaced the root)
    _database(tmp_path / "elsewhere" / "link.sqlite", "s", SECRET)
    (root / "link").symlink_to(tmp_path / "elsewhere")  # a directory linked out of the root
    wanted = str(tmp_path / "outside") if db_id == "absolute" else db_id
    previewer = ResultPreviewer(root)
    preview = previewer.preview(wanted, "SELECT v FROM s")
    assert not preview.rows and SECRET not in repr(preview)
    assert preview.summary == f"database not available: db_id {wanted!r} resolves outside the database root {root}"
    assert previewer.preview("shop", "SELECT count(*) FROM items").rows == [[2]]  # a database it serves: rows


ROLLOUT = {"step": 1, "task_id": "x-1", "db_id": "shop", "difficulty": "easy", "question": "q", "gold_sql": "SELECT 1",
           "final_sql": "SELECT 2", "solved": False, "reward": 0.0, "reward_terms": {"execution": 0.0}, "advantage": -0.5,
           "used_in_update": True, "group": 0, "group_member": 0, "turns": 1, "tool_calls": 0, "done_reason": "answer",
           "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}
#: (line 2 of a rollouts file, words its error must hold)
CRAFTED_ROLLOUTS = [
    pytest.param(json.dumps({**ROLLOUT, "group_member": "one"}), "field 'group_member'", id="text-group-member"),
    pytest.param(json.dumps({**ROLLOUT, "db_id": "/etc/secret"}), "field 'db_id'", id="absolute-db_id"),
    pytest.param(json.dumps({**ROLLOUT, "reward": 10**400}), "field 'reward'", id="reward-too-large-for-a-float"),
    pytest.param(json.dumps({**ROLLOUT, "messages": ["hi"]}), "field 'messages.0'", id="message-not-an-object"),
    pytest.param('{"step": 1, "task_id": "x", "m": ' + "[" * 5_000 + "]" * 5_000 + "}",
                 "JSON nested more than 32 levels deep", id="nested"),
]


@pytest.mark.parametrize(("line", "why"), CRAFTED_ROLLOUTS)
def test_crafted_rollout_record_is_refused_naming_file_and_line(tmp_path, line, why):
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join([json.dumps(ROLLOUT), line, json.dumps(ROLLOUT)]) + "\n")
    with pytest.raises(UserInputError) as caught:
        load_rollouts(path)
    message = str(caught.value)
    assert message.startswith(f"rollouts file {path}: line 2") and why in message, message
    assert "\n" not in message and len(message) < 500


def test_eval_cli_refuses_rollouts_naming_a_database_outside_the_root(tmp_path):
    """The attack as reported: `eval --rollouts crafted.jsonl` with an absolute db_id printed a row of
    a database outside the root in the page. Now: exit 2, one line, no report."""
    _database(tmp_path / "secret.sqlite", "s", SECRET)
    crafted = tmp_path / "crafted.jsonl"
    crafted.write_text(json.dumps({**ROLLOUT, "db_id": str(tmp_path / "secret"), "final_sql": "SELECT v FROM s"}) + "\n")
    out = tmp_path / "out"
    done = _cli("eval", "--policy", "oracle", "--limit", "1", "--rollouts", str(crafted), "--output-dir", str(out))
    line = _one_error_line(done)
    assert line.startswith(f"error: rollouts file {crafted}: line 1 is not a rollout record (field 'db_id'"), line
    assert not out.exists() and SECRET not in done.stdout + done.stderr


# ------------------------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    tokenizer = train_tokenizer(["SELECT count(*) FROM customer", "<tool_call> execute_sql </tool_call>"] * 10, 300)
    new_tiny_qwen2(tokenizer, hidden_size=16, layers=1, heads=2, kv_heads=1, intermediate_size=32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class _Run:
    """A real LoRA policy with its optimizer and scheduler, saved and loaded by the trainer's own code."""

    def __init__(self, model_dir: Path) -> None:
        from skyrl_tool_agent.config import Config
        from skyrl_tool_agent.grpo.optimizer import build_optimizer
        from tests.fixtures.tiny_policy import tiny_policy

        self.policy = tiny_policy(model_dir, mode="lora")
        self.optimizer, self.scheduler = build_optimizer(self.policy, Config())

    def save(self, root: Path) -> Path:
        from skyrl_tool_agent.grpo.checkpoint import save_checkpoint

        return save_checkpoint(root, 1, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler,
                               trainer_state={"loader": {}}, keep=2)

    def load(self, path: Path) -> dict:
        from skyrl_tool_agent.grpo.checkpoint import load_checkpoint

        return load_checkpoint(path, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)


@pytest.mark.parametrize("linked", ["optim.pt", "weights/adapter_model.safetensors", "manifest.json"])
def test_resume_refuses_a_link_out_of_the_checkpoint(model_dir, tmp_path, linked):
    from skyrl_tool_agent.grpo.checkpoint import CheckpointError, latest_checkpoint, write_manifest

    run = _Run(model_dir)
    path = run.save(tmp_path / "checkpoints")
    outside = tmp_path / "elsewhere" / Path(linked).name
    outside.parent.mkdir()
    shutil.move(path / linked, outside)  # a loadable file, outside the checkpoint
    (path / linked).symlink_to(outside)
    if linked != "manifest.json":
        write_manifest(path)  # whoever can write the checkpoint can rewrite its manifest too
    with pytest.raises(CheckpointError) as caught:
        run.load(path)
    assert f"{linked} is a link to {outside}, outside {path}" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(CheckpointError, match="no intact checkpoint .* is a link to"):  # --resume auto: none left
        latest_checkpoint(tmp_path / "checkpoints")


@pytest.mark.parametrize("manifest", ["with-sizes", "without-sizes", "with-sizes-emptied"])
def test_a_10gb_sparse_file_is_refused_before_hashing(model_dir, tmp_path, manifest):
    """Sizes come from `stat` before any hashing: the size the manifest records, or a cap for a
    file it records none for (a manifest written before sizes were, or a crafted `"sizes": {}`)."""
    from skyrl_tool_agent.grpo.checkpoint import MANIFEST, CheckpointError, verify_checkpoint

    path = _Run(model_dir).save(tmp_path / "checkpoints")
    recorded = json.loads((path / MANIFEST).read_text())
    if manifest == "without-sizes":
        (path / MANIFEST).write_text(json.dumps({"format": 1, "files": recorded["files"]}))
    elif manifest == "with-sizes-emptied":
        (path / MANIFEST).write_text(json.dumps({**recorded, "sizes": {}}))
    optim = path / "optim.pt"
    size = optim.stat().st_size
    optim.unlink()
    with optim.open("wb") as f:
        f.truncate(10 << 30)
    if optim.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this file system has no sparse files")
    start = time.monotonic()
    with pytest.raises(CheckpointError) as caught:
        verify_checkpoint(path)
    elapsed = time.monotonic() - start
    expected = (f"optim.pt is 10,737,418,240 bytes, its manifest records {size:,}" if manifest == "with-sizes" else
                "optim.pt is 10,737,418,240 bytes, over the 8,589,934,592 a file may have when its manifest records "
                "no sizes")
    assert expected in str(caught.value) and elapsed < 2.0, (str(caught.value), elapsed)
