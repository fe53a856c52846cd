"""evaluate.py end to end: real MCP server processes, real SQLite files, the real weave.Evaluation.

- the CLI, oracle over half the built-in dev set, no credentials: EX 1.0, every output file, the
  Weave Evaluation really ran (its scorer counts match), stdin closed and every network attempt
  refused and logged (none may happen);
- metrics against a scripted agent whose outcome per question is known (right, wrong, equivalent
  but not exact, tool error), overall / per difficulty / per database;
- pass@k: the estimator against brute-force enumeration, and through a real sampled run;
- the model policy: a tiny Qwen2 as a full model and as a LoRA adapter (merged on load);
- --compare: the table's deltas and the warnings.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
import os
import subprocess
import sys
import textwrap
from math import comb
from pathlib import Path

import pytest
import torch

from skyrl_tool_agent.config import EnvConfig, ModelConfig, UserInputError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.compare import comparison_rows, comparison_warnings, load_results
from skyrl_tool_agent.eval.evaluate import EvalOptions, run_evaluation
from skyrl_tool_agent.reports.evaluation import OutputPaths, print_comparison, write_outputs
from skyrl_tool_agent.eval.metrics import pass_at_k, pass_at_k_levels
from skyrl_tool_agent.eval.policies import load_eval_policy
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.rollout.agents import Agent, AgentTurn
from skyrl_tool_agent.rollout.collector import CollectorSettings
from tests.conftest import BUILTIN_DATA, REPO_ROOT
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db
from tests.fixtures.tiny_policy import build_tiny_model_dir

SCRIPT = REPO_ROOT / "training" / "scripts" / "evaluate.py"

# Runs a script with DNS and TCP refused; every attempt is logged to argv[1].
NET_GUARD = textwrap.dedent("""
    import runpy, socket, sys
    log = open(sys.argv[1], "w")
    def refuse(what):
        log.write(what + "\\n"); log.flush()
        raise OSError("network disabled in this test")
    socket.getaddrinfo = lambda *a, **k: refuse(f"getaddrinfo {a[:2]}")
    _connect = socket.socket.connect
    def connect(self, address):
        if self.family == socket.AF_UNIX:
            return _connect(self, address)
        return refuse(f"connect {address}")
    socket.socket.connect = connect
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")

# The other shop questions; with SHOP_TASKS: two databases' worth of difficulty buckets.
EXTRA_TASKS = [
    Task(task_id="shop-4", db_id="shop", question="How many orders are there?",
         gold_sql="SELECT count(*) FROM orders", difficulty="easy"),
    Task(task_id="depot-1", db_id="depot", question="How many customers are there?",
         gold_sql="SELECT count(*) FROM customer", difficulty="hard"),
]


class ScriptedAgent(Agent):
    """Answers each question with a fixed script of turns; `good` = samples that get the gold SQL."""

    def __init__(self, scripts: dict[str, list[str]], good=None) -> None:
        self.scripts = scripts
        self.good = good

    async def act(self, requests):
        out = []
        for r in requests:
            if self.good is not None:
                script = [format_answer(r.task.gold_sql if self.good(r.group_index) else "SELECT 1")]
            else:
                script = self.scripts[r.task.task_id]
            out.append(AgentTurn(text=script[min(r.turn, len(script) - 1)]))
        return out


@pytest.fixture(scope="module")
def db_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dbs")
    make_shop_db(root)
    depot = make_shop_db(root / "tmp")  # a second database with the same schema, under another id
    (root / "depot").mkdir()
    depot.rename(root / "depot" / "depot.sqlite")
    return root


@pytest.fixture(scope="module")
def runtime(db_root):
    rt = EnvRuntime(EnvConfig.exploring(), db_root)  # scripts explore
    yield rt
    rt.close()


def test_cli_oracle_builtin_dev_offline_no_prompt_no_network(tmp_path):
    out = tmp_path / "res" / "oracle.json"
    net_log = tmp_path / "net.log"
    guard = tmp_path / "guard.py"
    guard.write_text(NET_GUARD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "WEAVE_"))}
    env.update(WEAVE_DISABLED="true", WANDB_MODE="offline", HOME=str(tmp_path), NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, str(guard), str(net_log), str(SCRIPT), "--policy", "oracle", "--dataset", "builtin",
         "--split", "dev", "--limit", "160", "--output", str(out)],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert net_log.read_text() == "", f"network attempts: {net_log.read_text()}"
    results = json.loads(out.read_text())
    lines = [json.loads(line) for line in Path(results["files"]["trajectories"]).read_text().splitlines()]
    all_dev = {t["task_id"]: t for t in json.loads((BUILTIN_DATA / "dev.json").read_text())}
    dev = [all_dev[r["task_id"]] for r in lines]  # the stratified --limit subset
    assert results["n"] == len(dev) == 160 and results["available"] == len(all_dev) and results["skipped"] == 0
    assert {t["difficulty"] for t in dev} == {"easy", "medium", "hard"}
    assert results["execution_accuracy"] == 1.0 and results["exact_match"] == 1.0 and results["valid_sql_rate"] == 1.0
    assert results["tool_error_rate"] == 0.0 and results["mean_tool_calls"] == 1  # execute_sql, then the answer
    assert {k: m["n"] for k, m in results["by_difficulty"].items()} == Counter(t["difficulty"] for t in dev)
    assert {k: m["n"] for k, m in results["by_db"].items()} == Counter(t["db_id"] for t in dev)
    # The weave.Evaluation ran (disabled, locally) and scored every question.
    assert results["weave"]["mode"] == "disabled"
    assert results["weave"]["summary"]["execution_match"]["correct"]["true_count"] == len(dev)
    assert results["weave"]["summary"]["exact_match"]["correct"]["true_count"] == len(dev)
    first = lines[0]
    assert first["samples"][0]["messages"][0]["role"] == "system" and first["samples"][0]["final_sql"]
    assert Path(results["files"]["difficulty_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<html" in Path(results["files"]["report"]).read_text()
    assert "EX 1.000" in proc.stdout


def test_metrics_from_a_scripted_agent(runtime, tmp_path):
    tasks = [*SHOP_TASKS, *EXTRA_TASKS]
    scripts = {
        # right, exactly the gold query up to formatting
        "shop-1": [format_answer("SELECT COUNT(*) FROM customer WHERE city='Paris'")],
        # a failing tool call, then a wrong answer
        "shop-2": [format_tool_call("describe_table", {"db_id": "shop", "table": "nope"}),
                   format_answer("SELECT sum(amount) FROM orders")],
        # right result, different query (not an exact match)
        "shop-3": [format_answer("SELECT name FROM customer ORDER BY 1")],
        # no answer within the turn budget
        "shop-4": [format_tool_call("list_tables", {"db_id": "shop"})],
        "depot-1": [format_tool_call("list_tables", {"db_id": "depot"}), format_answer("SELECT count(*) FROM customer")],
    }
    settings = CollectorSettings(max_turns=3, concurrency=4)
    run = run_evaluation(tasks, runtime, ScriptedAgent(scripts), settings, EvalOptions(name="scripted"),
                         skipped=7, metadata={"dataset": "shop"})
    r = run.results
    assert (r["n"], r["episodes"], r["skipped"], r["dataset"], r["policy"]) == (5, 5, 7, "shop", "agent")
    assert r["execution_accuracy"] == pytest.approx(3 / 5)  # shop-1, shop-3, depot-1
    assert r["exact_match"] == pytest.approx(2 / 5)  # shop-1, depot-1
    assert r["answered_rate"] == pytest.approx(4 / 5)
    # 4 calls ran (shop-2: 1, shop-4: 2, its 3rd turn ends the episode unrun; depot-1: 1), 1 failed
    assert r["tool_error_rate"] == pytest.approx(1 / 4) and r["mean_tool_calls"] == pytest.approx(4 / 5)
    assert r["mean_turns"] == pytest.approx((1 + 2 + 1 + 3 + 2) / 5)
    assert r["by_db"]["depot"]["execution_accuracy"] == 1.0 and r["by_db"]["shop"]["execution_accuracy"] == 0.5
    assert list(r["by_difficulty"]) == ["easy", "medium", "hard"]
    assert r["by_difficulty"]["easy"]["n"] == 3 and r["by_difficulty"]["easy"]["execution_accuracy"] == pytest.approx(2 / 3)
    assert r["by_difficulty"]["medium"]["execution_accuracy"] == 0.0
    assert "pass_at_k" not in r
    assert r["weave"]["summary"]["execution_match"]["correct"]["true_count"] == 3
    assert r["weave"]["summary"]["exact_match"]["correct"]["true_count"] == 2
    by_id = {rec["task_id"]: rec for rec in run.records}
    assert [rec["task_id"] for rec in run.records] == [t.task_id for t in tasks]
    assert by_id["shop-3"]["solved"] and not by_id["shop-3"]["samples"][0]["exact_match"]
    assert by_id["shop-2"]["samples"][0]["tool_errors"] == 1 and by_id["shop-4"]["samples"][0]["final_sql"] is None

    paths = write_outputs(run, OutputPaths.beside(tmp_path / "scripted.json"), report=False)
    assert json.loads(paths.results.read_text())["by_db"]["shop"]["n"] == 4
    assert len(paths.trajectories.read_text().splitlines()) == 5 and not paths.report.exists()


def test_pass_at_k_estimator_matches_enumeration():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - comb(197, 100) / comb(200, 100))
    assert pass_at_k_levels(1) == [1] and pass_at_k_levels(8) == [1, 2, 5, 8]
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_pass_at_k_through_a_sampled_run(runtime):
    # Samples 0 and 2 of each question answer right, 1 and 3 wrong: c=2 of n=4.
    agent = ScriptedAgent({}, good=lambda g: g % 2 == 0)
    run = run_evaluation(SHOP_TASKS, runtime, agent, CollectorSettings(max_turns=2),
                         EvalOptions(num_samples=4, sampling=SamplingParams(temperature=1.0)))
    r = run.results
    assert (r["n"], r["episodes"]) == (3, 12)
    assert r["execution_accuracy"] == pytest.approx(0.5)
    assert r["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(1 - 1 / 6), "4": 1.0}
    assert all(rec["num_samples"] == 4 and rec["num_correct"] == 2 for rec in run.records)
    assert [s["group_index"] for s in run.records[0]["samples"]] == [0, 1, 2, 3]
    with pytest.raises(UserInputError):
        EvalOptions(num_samples=4, sampling=SamplingParams(temperature=0.0))


@pytest.fixture(scope="module")
def tiny_model(runtime, tmp_path_factory) -> Path:
    # An untrained Qwen2 with its own tokenizer: a real policy (if a poor one) is all these tests need.
    return build_tiny_model_dir(runtime, SHOP_TASKS, tmp_path_factory.mktemp("tiny"), sft_steps=0)


def test_model_policy_full_and_lora_adapter(runtime, tiny_model, tmp_path):
    from tests.fixtures.tiny_policy import tiny_policy

    config = ModelConfig(name_or_path=str(tiny_model), device="cpu")
    trained = tiny_policy(tiny_model, mode="lora")
    torch.manual_seed(0)
    for name, param in trained.model.named_parameters():
        if "lora_B" in name:  # a non-trivial adapter (fresh ones are zero)
            param.data.normal_(0, 0.5)
    trained.save(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()

    merged = load_eval_policy(tmp_path / "adapter", config)
    ids = torch.tensor([trained.tokenizer("Database: shop\nQuestion: How many customers?")["input_ids"]])
    mask = torch.ones_like(ids)
    want, _ = trained.token_logprobs(ids, mask)
    got, _ = merged.token_logprobs(ids, mask)
    base, _ = load_eval_policy(tiny_model, config).token_logprobs(ids, mask)
    assert torch.allclose(got, want, atol=1e-4)  # the adapter is applied ...
    assert not torch.allclose(base, want, atol=1e-3)  # ... and it matters

    settings = CollectorSettings(max_turns=2, max_new_tokens_per_turn=24, max_total_tokens=1500)
    runs = [run_evaluation(SHOP_TASKS, runtime, merged, settings, EvalOptions(model_path="adapter")) for _ in range(2)]
    r = runs[0].results
    assert r["policy"] == "model" and r["n"] == 3 and 0.0 <= r["execution_accuracy"] <= 1.0
    assert r["weave"]["summary"]["execution_match"]["correct"]["true_count"] == round(3 * r["execution_accuracy"])
    for rec in runs[0].records:
        sample = rec["samples"][0]
        assert sample["turns"] >= 1 and sample["policy_tokens"] > 0
        assert sum(m["role"] == "assistant" for m in sample["messages"]) == sample["turns"]
    # greedy: the same episodes twice
    assert [s["messages"] for rec in runs[1].records for s in rec["samples"]] == \
           [s["messages"] for rec in runs[0].records for s in rec["samples"]]


def test_compare_table_and_warnings(tmp_path):
    base = {"execution_accuracy": 0.25, "exact_match": 0.1, "mean_turns": 3.0, "n": 4, "dataset": "spider",
            "split": "dev", "task_ids_sha1": "a", "by_difficulty": {"easy": {"execution_accuracy": 0.5}, "hard": {"execution_accuracy": 0.0}}}
    current = {**base, "execution_accuracy": 0.75, "mean_turns": 2.5,
               "by_difficulty": {"easy": {"execution_accuracy": 1.0}, "extra": {"execution_accuracy": 0.5}}}
    rows = {row.label: row for row in comparison_rows(base, current)}
    assert rows["execution accuracy"].delta == pytest.approx(0.5)
    assert rows["mean turns"].delta == pytest.approx(-0.5)
    assert rows["EX easy"].delta == pytest.approx(0.5)
    assert rows["EX hard"].current is None and rows["EX hard"].delta is None
    assert [label for label in rows if label.startswith("EX ")] == ["EX easy", "EX hard", "EX extra"]
    assert comparison_warnings(base, current) == []
    assert comparison_warnings(base, {**current, "task_ids_sha1": "b", "split": "train"}) == [
        "split differs: dev vs train", "different question sets (n=4 vs n=4)"]

    from rich.console import Console

    console = Console(record=True, width=120)
    print_comparison(base, current, console=console)
    text = console.export_text()
    assert "execution accuracy" in text and "+0.500" in text and "-0.500" in text

    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(UserInputError, match="not a results.json"):
        load_results(tmp_path / "bad.json")
    with pytest.raises(UserInputError, match="no such file"):
        load_results(tmp_path / "missing.json")


def test_compare_interval_pairs_each_questions_samples_not_its_first(tmp_path):
    """With k samples per question the table's execution accuracy is avg@k, and the paired interval
    printed under it is of that same change: each question's solved share on each side (a sample
    lost to infrastructure left out), never only its first sample's outcome. The baseline's
    per-question samples are read from the JSONL its results.json names, as `--compare` reads them."""
    from rich.console import Console

    from skyrl_tool_agent.eval.compare import paired_change

    def record(task_id: str, outcomes: list[bool | None]) -> dict:  # None: lost to infrastructure
        samples = [{"solved": bool(o), "done_reason": "error" if o is None else "answered"} for o in outcomes]
        return {"task_id": task_id, "num_samples": len(samples), "num_correct": sum(map(bool, outcomes)),
                "solved": bool(outcomes[0]), "scored": outcomes[0] is not None, "samples": samples}

    # first samples: 2/3 solved before, 1/3 after (-33 points); all samples: 5/12 before, 8/12 after (+25)
    before = [record("q1", [True, False, False, False]), record("q2", [False] * 4), record("q3", [True] * 4)]
    after = [record("q1", [False, True, True, True]), record("q2", [False, True, False, False]),
             record("q3", [True, True, True, None])]  # q3's lost sample: 3 of 3 scored solved
    (tmp_path / "base_trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in before))
    base = {"execution_accuracy": 5 / 12, "n": 3, "num_samples": 4, "files": {"trajectories": "base_trajectories.jsonl"}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    base = load_results(tmp_path / "base.json")  # finds the JSONL beside it
    current = {"execution_accuracy": 8 / 11, "n": 3, "num_samples": 4}

    change = paired_change(base, after)
    assert change.n == 3 and change.before == pytest.approx(5 / 12)
    assert change.delta == pytest.approx((0.75 + 0.25 + 1.0) / 3 - 5 / 12) == pytest.approx(0.25)
    console = Console(record=True, width=200)
    print_comparison(base, current, console=console, records=after)
    text = console.export_text()
    assert "execution accuracy change (this run - baseline): +25.0 points" in text, text
    assert "each the mean of its 4 samples" in text
    # a greedy baseline from a training run's lists: one outcome per question
    greedy = paired_change({"task_ids": ["q1", "q2", "q3"], "solved": [True, None, False]}, after)
    assert greedy.n == 2 and greedy.delta == pytest.approx(((0.75 - 1.0) + (1.0 - 0.0)) / 2)


def test_cli_user_errors_exit_2(tmp_path, capsys):
    import runpy

    main = runpy.run_path(str(SCRIPT), run_name="evaluate_cli")["main"]
    cases = [
        (["--policy", "oracle", "--compare", str(tmp_path / "missing.json")], "--compare: no such file"),
        (["--policy", "oracle", "--dataset", "spider", "--spider-root", str(tmp_path)], "Spider not found"),
        (["--policy", "model", "--model-path", str(tmp_path / "nothing")], "no such directory"),
        (["--policy", "oracle", "--num-samples", "3", "--temperature", "0"], "needs sampling"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main([*args, "--output", str(tmp_path / "o.json")])
        assert exit_info.value.code == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], (args, err)
    assert not (tmp_path / "o.json").exists()


def test_a_deeply_nested_results_file_is_one_clear_error(tmp_path, capsys):
    """json's C scanner recurses per nesting level: a crafted results.json (or the trajectories
    file it names) used to raise RecursionError through `--compare` (a traceback, exit 1)."""
    import runpy

    from skyrl_tool_agent.eval.compare import baseline_outcomes

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserInputError, match="not a results.json \\(nested too deeply\\)"):
        load_results(deep)
    main = runpy.run_path(str(SCRIPT), run_name="evaluate_cli")["main"]
    with pytest.raises(SystemExit) as exit_info:
        main(["--policy", "oracle", "--compare", str(deep), "--output", str(tmp_path / "o.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nested too deeply" in err[0], err
    (tmp_path / "not-utf8.json").write_bytes(b'{"execution_accuracy": "\xff"}')
    with pytest.raises(UserInputError, match="not a results.json"):
        load_results(tmp_path / "not-utf8.json")
    # a results.json whose per-question file is the crafted one: no outcomes, no crash
    (tmp_path / "deep.jsonl").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    assert baseline_outcomes({"files": {"trajectories": str(tmp_path / "deep.jsonl")}}) is None


def test_weave_mode_needs_credentials_and_falls_back(monkeypatch):
    from skyrl_tool_agent.eval import weave_eval
    from skyrl_tool_agent.eval.weave_setup import weave_mode

    key = {"WANDB_API_KEY": "k" * 40}
    assert weave_mode("auto", {}) == "disabled"
    assert weave_mode("auto", key) == "online"
    assert weave_mode("offline", key) == "disabled"
    assert weave_mode("auto", {**key, "WANDB_MODE": "offline"}) == "disabled"
    assert weave_mode("auto", {**key, "WEAVE_DISABLED": "true"}) == "disabled"

    def broken_init(project):
        raise ConnectionError("no route to wandb")

    monkeypatch.setattr(weave_eval.weave, "get_client", lambda: None)
    monkeypatch.setattr(weave_eval.weave, "init", broken_init)
    monkeypatch.delenv("WEAVE_DISABLED", raising=False)
    with weave_eval.weave_session("p", "online") as mode:
        assert mode == "disabled" and os.environ["WEAVE_DISABLED"] == "true"
    assert "WEAVE_DISABLED" not in os.environ


def test_questions_whose_gold_sql_cannot_run_are_found(db_root):
    from skyrl_tool_agent.eval.splits import gold_sql_errors

    broken = [
        Task(task_id="b-1", db_id="shop", question="?", gold_sql="SELECT x FROM no_such_table", difficulty="easy"),
        Task(task_id="b-2", db_id="shop", question="?", difficulty="easy",
             gold_sql="SELECT name FROM customer ORDER BY name LIMIT 1 INTERSECT SELECT name FROM customer"),
        Task(task_id="b-3", db_id="gone", question="?", gold_sql="SELECT 1", difficulty="easy"),
    ]
    errors = gold_sql_errors([*SHOP_TASKS, *EXTRA_TASKS, *broken], db_root)
    assert sorted(errors) == ["b-1", "b-2", "b-3"]
    assert "no such table" in errors["b-1"] and "ORDER BY" in errors["b-2"] and "not found" in errors["b-3"]
