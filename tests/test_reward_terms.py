"""Rewards as named, weighted terms: the default terms reproduce the old fixed-weight reward, the one
formula's rules, terms of your own (README's example trains), and each term logged as its own metric."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import skyrl_gym

import skyrl_tool_agent  # noqa: F401 - registers mcp_tool_env
from skyrl_tool_agent.config import RewardTermConfig, load_config
from skyrl_tool_agent.env.pools import EnvDataError, build_rubric
from skyrl_tool_agent.rewards import (
    Episode,
    GoldResultCache,
    Rubric,
    reward_term,
    score_answer,
)
from skyrl_tool_agent.rewards import rubric as rubric_module
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory
from tests.fixtures.config_files import CONFIGS
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db

REPO = Path(__file__).resolve().parents[1]
DB_ROOT = REPO / "data" / "processed" / "databases"
LIBRARY = DB_ROOT / "library" / "library.sqlite"
GOLD = "SELECT COUNT(*) FROM books WHERE genre = 'Thriller'"
WRONG = "SELECT COUNT(*) FROM books WHERE genre = 'History'"
#: 215 distinct real episodes (the shipped model's sampled answers in a 10-minute GRPO run on the
#: built-in pool, with their format verdict) and 243 edge cases (gold answers in malformed episodes,
#: no answer, blank, unparseable, another task's gold, VALUES, a missing table) on the built-in
#: databases, scored by the fixed-weight reward this module replaced (commit 5b28b79).
GOLDEN = REPO / "tests" / "fixtures" / "reward_golden.jsonl"
HERE = "tests.test_reward_terms"


def _golden() -> list[dict]:
    return [json.loads(line) for line in GOLDEN.read_text().splitlines()[1:]]


def _rubric(*terms: tuple) -> Rubric:
    """A rubric through the config schema: (name, weight) or (name, weight, function)."""
    return Rubric.from_specs(RewardTermConfig(name=t[0], weight=t[1], function=t[2] if len(t) > 2 else None)
                             for t in terms)


DEFAULTS = (("execution", 1.0), ("format", 0.1), ("syntax", 0.05), ("partial", 0.2))


# Terms of our own, named by import path as a user would.
def tool_error_penalty(episode: Episode) -> float:
    return episode.tool_errors


def always_one(episode: Episode) -> float:
    return 1.0


def not_a_number(episode: Episode) -> float:
    return math.nan


@reward_term(only_when_wrong=True)
def near_miss_bonus(episode: Episode) -> float:
    return 1.0


SEEN: list[object] = []


def sees_the_comparison(episode: Episode) -> float:
    SEEN.append(episode.comparison)
    return float(episode.correct)


def two_arguments(episode: Episode, other: int) -> float:
    return 0.0


# ------------------------------------------------------------------------- the old reward, kept


def test_default_terms_reproduce_the_old_reward_on_real_episodes() -> None:
    cases = _golden()
    assert len(cases) == 458 and {c["terms"]["execution"] for c in cases} == {0.0, 1.0}
    cache = GoldResultCache()
    for case in cases:
        db = DB_ROOT / case["db_id"] / f"{case['db_id']}.sqlite"
        got = score_answer(case["answer"], case["gold_sql"], db, format_ok=case["format_ok"], cache=cache)
        assert got.total == case["total"], case  # bit for bit: same terms, same sums in the same order
        assert got.terms == case["terms"] and got.solved == (case["terms"]["execution"] == 1.0), case


@pytest.mark.parametrize("weights", [(1.0, 0.1, 0.05, 0.2), (1.0, 0.0, 0.0, 0.5), (2.0, 0.3, 0.0, 2.0),
                                     (1.0, 0.0, 0.0, 0.0), (0.5, 1.0, 1.0, 0.25)])
def test_the_formula_is_the_old_one_for_any_builtin_weights(weights: tuple[float, ...]) -> None:
    """The old fixed formula, written out here as the reference, on the golden episodes' terms."""
    we, wf, ws, wp = weights
    rubric = _rubric(*zip(("execution", "format", "syntax", "partial"), weights))
    assert rubric.normaliser == pytest.approx(we + wf + ws)
    for case in _golden():
        t = case["terms"]
        old = (we * t["execution"] + wf * t["format"] + ws * t["syntax"]
               + wp * t["partial"] * (1 - t["execution"])) / (we + wf + ws)
        answered = bool(case["answer"] and case["answer"].strip())
        new = rubric.combine(t, answered=answered, correct=t["execution"] == 1.0)
        assert new == pytest.approx(min(1.0, max(0.0, old)), abs=1e-12), case


# ------------------------------------------------------------------------------ the formula


def test_a_penalty_is_not_in_the_divisor_and_the_total_stays_in_0_1() -> None:
    rubric = _rubric(*DEFAULTS, ("tool_error_penalty", -0.05, f"{HERE}:tool_error_penalty"))
    assert rubric.normaliser == pytest.approx(1.15)
    clean = rubric.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True))
    assert clean.total == 1.0 and clean.terms["tool_error_penalty"] == 0.0
    two = rubric.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True, tool_errors=2))
    assert two.total == pytest.approx((1.15 - 2 * 0.05) / 1.15) and two.terms["tool_error_penalty"] == 2.0
    wrong = rubric.score(Episode(WRONG, GOLD, LIBRARY, format_ok=True, tool_errors=40))
    assert wrong.total == 0.0 and not wrong.solved  # clamped, not negative


def test_no_answer_scores_zero_whatever_the_terms_say() -> None:
    rubric = _rubric(*DEFAULTS, ("showed_up", 0.5, f"{HERE}:always_one"))
    for answer in (None, "  "):
        result = rubric.score(Episode(answer, GOLD, LIBRARY, format_ok=False))
        assert result.total == 0.0 and result.terms["showed_up"] == 1.0 and result.terms["execution"] == 0.0
    assert rubric.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True)).total == 1.0  # 0.5 of 1.65 is earned


def test_an_only_when_wrong_term_of_your_own_counts_only_for_wrong_answers() -> None:
    rubric = _rubric(("execution", 1.0), ("near_miss_bonus", 0.5, f"{HERE}:near_miss_bonus"))
    assert rubric.normaliser == 1.0 and [t.only_when_wrong for t in rubric.terms] == [False, True]
    assert rubric.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True)).total == 1.0
    assert rubric.score(Episode(WRONG, GOLD, LIBRARY, format_ok=True)).total == 0.5
    assert "0.5 x near_miss_bonus (only when the answer is wrong)) / 1" in rubric.describe()


def test_the_builtin_literals_term_counts_the_gold_constants_of_wrong_answers_only() -> None:
    """`literals`: a wrong answer that states the question's constant ('Thriller') earns its weight;
    one with another constant earns nothing; a correct answer's total stays 1 (only when wrong)."""
    with_literals, without = _rubric(*DEFAULTS, ("literals", 0.2)), _rubric(*DEFAULTS)
    assert with_literals.normaliser == without.normaliser == pytest.approx(1.15)
    other_columns = "SELECT title FROM books WHERE genre = 'Thriller'"  # wrong, the right constant
    for answer, literals in ((other_columns, 1.0), (WRONG, 0.0), (GOLD, 1.0)):
        episode = Episode(answer, GOLD, LIBRARY, format_ok=True)
        got, base = with_literals.score(episode), without.score(episode)
        assert got.terms["literals"] == literals, answer
        counted = 0.0 if got.solved else 0.2 * literals / 1.15
        assert got.total == pytest.approx(base.total + counted), answer
    assert with_literals.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True)).total == 1.0


def test_every_term_reads_one_shared_execution_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = rubric_module.compare_execution
    monkeypatch.setattr(rubric_module, "compare_execution", lambda *a, **k: calls.append(a) or real(*a, **k))
    SEEN.clear()
    rubric = _rubric(*DEFAULTS, ("matched", 0.0, f"{HERE}:sees_the_comparison"))
    result = rubric.score(Episode("SELECT nope FROM books", GOLD, LIBRARY, format_ok=True))
    assert len(calls) == 1 and len(SEEN) == 1 and SEEN[0].pred_error_kind is not None
    assert result.terms["matched"] == 0.0 and result.terms["syntax"] == 1.0  # sqlglot parses it; SQLite refused it
    assert "no such column" in (result.pred_error or "")


def test_a_term_that_returns_no_finite_number_is_an_error() -> None:
    rubric = _rubric(*DEFAULTS, ("broken", 0.1, f"{HERE}:not_a_number"))
    with pytest.raises(ValueError, match="term 'broken' returned nan, not a finite number"):
        rubric.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True))


# ------------------------------------------------------------------------------- the config


def _build_error(*overrides: str) -> str:
    """The one-line error of building the run's reward from configs/ with `overrides`, which load
    (a config is data: no reward code runs and no rule is checked until the run is built)."""
    config = load_config(CONFIGS, list(overrides))
    with pytest.raises(EnvDataError) as info:
        build_rubric(config.env)
    message = str(info.value)
    assert "\n" not in message and message.startswith("env.reward.terms (task family 'sql'): "), message
    return message


@pytest.mark.parametrize(("terms", "fragment"), [
    ("[{name: execution, weight: 1}, {name: pen, weight: -1, function: 'nowhere.mod:fn'}]",
     "term 1 (pen): function 'nowhere.mod:fn': cannot import nowhere.mod (ModuleNotFoundError"),
    ("[{name: execution, weight: 1}, {name: pen, weight: -1, function: 'missing_file.py:fn'}]",
     "term 1 (pen): function 'missing_file.py:fn': no file "),
    (f"[{{name: execution, weight: 1}}, {{name: pen, weight: -1, function: '{HERE}:nope'}}]",
     f"term 1 (pen): function '{HERE}:nope': {HERE} has no function 'nope'"),
    ("[{name: execution, weight: 1}, {name: pen, weight: -1, function: just_a_name}]",
     "function 'just_a_name': expected 'module:function' or 'path/to/file.py:function'"),
    (f"[{{name: execution, weight: 1}}, {{name: pen, weight: -1, function: '{HERE}:two_arguments'}}]",
     "must take one argument, the episode"),
    (f"[{{name: execution, weight: 1}}, {{name: partial, weight: 0.1, function: '{HERE}:always_one'}}]",
     "term 1 (partial): 'partial' is a built-in term: give your own term another name"),
    ("[{name: exec, weight: 1}]", "term 0 (exec): unknown reward term 'exec': the built-in terms are execution,"),
    (f"[{{name: execution, weight: 1}}, {{name: mean, weight: 0.1, function: '{HERE}:always_one'}}]",
     "term name 'mean' is reserved (reward/mean is a train metric)"),
    ("[{name: execution, weight: 1}, {name: execution, weight: 1}]", "term 'execution' is listed twice"),
    ("[{name: execution, weight: 1}, {name: format, weight: -1}]",
     "term 'format': a built-in term's weight must be >= 0, got -1"),
    ((f"[{{name: execution, weight: 0.4}}, {{name: partial, weight: 0.2}}, "
      f"{{name: bonus, weight: 0.3, function: '{HERE}:near_miss_bonus'}}]"),
     "only_when_wrong terms (partial 0.2 + bonus 0.3) must not outweigh execution (0.4)"),
    (f"[{{name: pen, weight: -1, function: '{HERE}:tool_error_penalty'}}, {{name: partial, weight: 0}}]",
     "the terms a perfect episode earns (weight > 0, not only_when_wrong) weigh 0 in all"),
    ("[{name: execution, weight: 0}, {name: format, weight: 0}]",
     "the terms a perfect episode earns (weight > 0, not only_when_wrong) weigh 0 in all"),
])
def test_bad_terms_are_one_line_errors_when_the_run_is_built(terms: str, fragment: str) -> None:
    message = _build_error(f"env.reward.terms={terms}")
    assert fragment in message, message


def test_a_reward_module_runs_when_the_run_is_built_not_when_the_config_loads(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch,
                                                                             capsys: pytest.CaptureFixture) -> None:
    """A term of your own whose module raises at import: the config loads (it is data); the run
    refuses to start with one error line naming the term, before any MCP server process is
    spawned or anything is written (the config imported it, and failed, as it loaded before)."""
    import sys

    import psutil

    from skyrl_tool_agent.config import UserInputError
    from skyrl_tool_agent.jobs.train import run_training

    (tmp_path / "boom_rewards.py").write_text("raise RuntimeError('boom at import')\n\n\n"
                                              "def term(episode):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = "env.reward.terms=[{name: execution, weight: 1}, {name: boom, weight: 0.1, function: 'boom_rewards:term'}]"
    out = tmp_path / "run"
    config = load_config(CONFIGS, [line, f"training.output_dir={out}"])
    assert "boom_rewards" not in sys.modules and config.env.reward.terms[1].function == "boom_rewards:term"
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(UserInputError) as info:
        run_training(config)
    message = str(info.value)
    assert "\n" not in message
    assert ("term 1 (boom): function 'boom_rewards:term': cannot import boom_rewards (RuntimeError: boom at import)"
            in message), message
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children  # no server was started
    assert not out.exists()
    # The command, through its `main` in this process (`cli_in_process`: a process of its own would
    # import torch and transformers again to reach the same line; tests/test_trainer.py's bad inputs
    # launch `train` to check what a refused run's process exits with): exit 2, one `error:` line,
    # no traceback.
    from tests.fixtures.cli_in_process import cli_in_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)  # the command's logging sets it: not for the tests after this one
    code, _, stderr = cli_in_process(["train", "--set", line, "--set", f"training.output_dir={out}"], capsys)
    errors = [x for x in stderr.splitlines() if x.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "boom at import" in errors[0], stderr[-2000:]
    assert "Traceback" not in stderr and not out.exists()


def test_readme_example_config_loads_and_builds_the_rubric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, line = _readme_example()
    (tmp_path / "my_rewards.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    config = load_config(_with_line(tmp_path, line))
    names = [t.name for t in config.env.reward.terms]
    assert names == ["execution", "format", "syntax", "partial", "tool_error_penalty"]
    rubric = Rubric.from_specs(config.env.reward.terms)
    result = rubric.score(Episode(GOLD, GOLD, LIBRARY, format_ok=True, tool_errors=1))
    assert result.terms["tool_error_penalty"] == 1.0 and result.total == pytest.approx(1.1 / 1.15)


# ------------------------------------------------------------------- the env and the metrics


def test_env_returns_the_total_and_each_term_by_name(tmp_path: Path) -> None:
    make_shop_db(tmp_path / "dbs")
    (tmp_path / "terms.py").write_text("def failed_calls(episode):\n    return episode.tool_errors\n\n"
                                       "def turns_taken(episode):\n    return episode.turns\n")
    reward = {"terms": [*({"name": n, "weight": w} for n, w in DEFAULTS),
                        {"name": "failed_calls", "weight": -0.05, "function": f"{tmp_path}/terms.py:failed_calls"},
                        {"name": "turns_taken", "weight": 0.0, "function": f"{tmp_path}/terms.py:turns_taken"}]}
    task = SHOP_TASKS[0]
    env = skyrl_gym.make("mcp_tool_env", env_config={"db_root": str(tmp_path / "dbs"), "reward": reward},
                         extras={"reward_spec": {"method": "rule", "ground_truth": task.gold_sql}, "db_id": task.db_id})
    env.init([{"role": "user", "content": f"Database: shop\nQuestion: {task.question}"}])
    out = env.step('<tool_call>\n{"name": "execute_sql", "arguments": {"sql": "SELECT * FROM nowhere"}}\n</tool_call>')
    assert not out["done"] and out["metadata"]["tool_errors"] == 1
    out = env.step(f"<answer>{task.gold_sql}</answer>")
    assert out["done"] and out["reward"] == pytest.approx((1.15 - 0.05) / 1.15)
    assert out["metadata"]["reward_components"] == {"execution": 1.0, "format": 1.0, "syntax": 1.0, "partial": 1.0,
                                                    "failed_calls": 1.0, "turns_taken": 2.0}
    assert out["metadata"]["solved"] == 1.0


def _trajectory(task_id: str, components: dict[str, float], done_reason: str = "answer") -> Trajectory:
    result = EpisodeResult(task_id, "shop", reward=1.0, components=components, done_reason=done_reason,
                           final_sql="SELECT 1")
    return Trajectory(task_id, 0, [], result)


def test_evaluation_results_hold_each_terms_mean() -> None:
    from skyrl_tool_agent.eval.metrics import (
        evaluation_metrics,
        reward_term_means,
        summarize,
    )

    trajectories = [_trajectory("a", {"execution": 1.0, "syntax": 1.0, "pen": 2.0}),
                    _trajectory("b", {"execution": 0.0, "syntax": 0.0, "pen": 0.0}),
                    _trajectory("c", {}, done_reason="error")]  # never scored: left out
    assert reward_term_means(trajectories) == {"execution": 0.5, "syntax": 0.5, "pen": 1.0}
    results = evaluation_metrics(trajectories, {"a": "SELECT 1", "b": "SELECT 1", "c": "SELECT 1"})
    assert results["reward_terms"] == {"execution": 0.5, "syntax": 0.5, "pen": 1.0} and results["valid_sql_rate"] == 0.5
    # valid_sql_rate is the syntax term's verdict: a reward without that term reports none
    assert "valid_sql_rate" not in summarize([_trajectory("a", {"execution": 1.0})])


# -------------------------------------------------------------- the README's example, trained


def _readme_example() -> tuple[str, str]:
    """The Rewards section's Python file and YAML line, as a reader would copy them."""
    section = (REPO / "README.md").read_text().split("\n## Rewards\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(# my_rewards.py\n.*?)```", section, re.DOTALL)
    line = re.search(r"```yaml\n(.*?)\n```", section, re.DOTALL)
    assert code and line, "README's Rewards section lost its example"
    return code.group(1), line.group(1)


def _with_line(tmp_path: Path, line: str) -> Path:
    """A copy of configs/ with the README's line appended to reward.terms."""
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    path = configs / "env_config.yaml"
    lines = path.read_text().splitlines()
    end = lines.index(next(x for x in lines if x.startswith("  keep_distinct:")))  # the key after terms
    path.write_text("\n".join([*lines[:end], line, *lines[end:]]) + "\n")
    return configs


def test_readme_example_term_is_logged_by_a_real_training_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's function and YAML line, nothing else: two GRPO steps of the tiny model find
    reward/tool_error_penalty in metrics.jsonl and the term in rollouts.jsonl and the model card."""
    from skyrl_tool_agent.config import EnvConfig
    from skyrl_tool_agent.data.tasks import save_tasks
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.jobs.train import run_training
    from tests.fixtures.tiny_policy import build_tiny_model_dir

    make_shop_db(tmp_path / "dbs")
    save_tasks(SHOP_TASKS, tmp_path / "tasks.json")
    runtime = EnvRuntime(EnvConfig(), tmp_path / "dbs")
    try:
        model_dir = build_tiny_model_dir(runtime, SHOP_TASKS * 4, tmp_path / "model", sft_steps=20)
    finally:
        runtime.close()
    code, line = _readme_example()
    (tmp_path / "my_rewards.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # "in the directory you train from"
    out = tmp_path / "run"
    sets = {
        "model.name_or_path": model_dir, "model.device": "cpu", "model.lora.r": 4, "model.lora.alpha": 8,
        "training.mode": "lora", "training.output_dir": out, "training.data.train_file": tmp_path / "tasks.json",
        "training.data.dev_file": tmp_path / "tasks.json", "training.data.db_root": tmp_path / "dbs",
        "training.data.train_pool": "file", "training.max_steps": 2, "training.tasks_per_step": 2,
        "training.checkpoint_every": 0, "training.eval_every": 0, "training.eval_num_tasks": 2,
        "training.eval_samples": 0, "training.probe_tasks": 0, "training.probe_held_out_tasks": 0,
        "training.wandb.mode": "disabled", "grpo.group_size": 2, "grpo.max_turns": 3,
        "grpo.max_new_tokens_per_turn": 40, "grpo.max_total_tokens": 1000,
    }
    run_training(load_config(_with_line(tmp_path, line), [f"{k}={v}" for k, v in sets.items()]))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] >= 1]
    assert len(trained) == 2
    for row in trained:
        for name in ("execution", "format", "syntax", "partial", "tool_error_penalty"):
            assert f"reward/{name}" in row, (name, row)
        assert row["reward/tool_error_penalty"] >= 0.0 and 0.0 <= row["reward/execution"] <= 1.0
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and all("tool_error_penalty" in r["reward_terms"] for r in rollouts)
    assert "-0.05 x tool_error_penalty" in (out / "final" / "README.md").read_text()

