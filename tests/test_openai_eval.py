"""`evaluate --policy openai`: the same MCP episodes against a served model, through real servers.

- `transformers serve` (the OpenAI-compatible server that ships with transformers, started here on a
  free loopback port) serving the embedded model: 4 dev tasks through the CLI give, message for
  message, the episodes and EX of the local model at temperature 0; results.json names the endpoint
  and counts one request per turn; the server stops cleanly on SIGTERM (exit 0, port closed);
- a turn the server cannot produce (a tool call cut off by max_tokens: transformers serve answers
  HTTP 500 while parsing it) is retried, then the episode is unscored (an infra error), recorded in agent_meta;
- a dead URL or an unknown model: one `error:` line and exit 2 before any episode;
- retries with exponential backoff, per-request timeouts and fatal statuses against a scripted
  stdlib HTTP server on loopback (real sockets, real status codes, real delays).

Skips only when `transformers serve` cannot start here; the skip message says why.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import pytest

from skyrl_tool_agent.config import load_config
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.evaluate import EvalOptions, run_evaluation
from skyrl_tool_agent.eval.policies import load_eval_policy
from skyrl_tool_agent.policy.sampling_params import GREEDY, SamplingParams
from skyrl_tool_agent.eval.splits import load_eval_tasks
from skyrl_tool_agent.policy.loading import resolve_model_path
from skyrl_tool_agent.rollout.agents import OracleAgent, TurnRequest, make_agent
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.openai_agent import (
    Endpoint,
    EndpointError,
    OpenAIChatAgent,
    message_text,
)

TRANSFORMERS_CLI = Path(sys.executable).parent / "transformers"
LIMIT = 4  # dev tasks in the served-vs-local comparison


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class ServedModel:
    """`transformers serve MODEL_DIR` on a free loopback port, offline, with an empty HF_HOME: no hub
    cache, the state of a fresh machine (its /v1/models then answers 500 and closes the connection)."""

    def __init__(self, model_dir: str, home: Path) -> None:
        self.model = model_dir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        assert not (home / "hub").exists()
        self.log_path = home / "serve.log"
        # One thread: on a shared 2-core machine torch's default two threads make each turn ~50x slower.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "OMP_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        self.proc: subprocess.Popen[bytes] | None = None
        if TRANSFORMERS_CLI.is_file() and importlib.util.find_spec("fastapi") is not None:
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    [str(TRANSFORMERS_CLI), "serve", model_dir, "--host", "127.0.0.1", "--port", str(self.port),
                     "--device", "cpu", "--dtype", "float32"],  # float32: what the local path runs on CPU
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ready: bool | None = None
        self.exit_code: int | None = None

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Skip the calling test, saying why, when the server does not come up."""
        if self.proc is None:
            pytest.skip(f"transformers serve cannot start: no {TRANSFORMERS_CLI} or no fastapi "
                        "(pip install -e '.[dev]' installs transformers[serving])")
        deadline = time.monotonic() + timeout_s
        while self.ready is None:
            if self.proc.poll() is not None:
                self.ready = False
            elif _port_open(self.port):
                self.ready = True
            elif time.monotonic() > deadline:
                self.ready = False
            else:
                time.sleep(0.2)
        if not self.ready:
            tail = self.log_path.read_text(errors="replace")[-600:]
            pytest.skip(f"transformers serve did not start within {timeout_s:.0f} s (exit {self.proc.poll()}): {tail}")

    def stop(self) -> None:
        """SIGTERM, and check it was a clean shutdown: uvicorn's shutdown ran to its end within 20 s
        (uvicorn then re-raises the signal it caught, so the exit status is -SIGTERM), port closed."""
        if self.proc is None or self.exit_code is not None:
            return
        self.proc.terminate()
        self.exit_code = self.proc.wait(timeout=20)
        if self.ready:
            log = self.log_path.read_text(errors="replace")
            assert self.exit_code in (0, -signal.SIGTERM), log[-2000:]
            assert "Application shutdown complete." in log and "Finished server process" in log, log[-2000:]
            assert not _port_open(self.port)


@pytest.fixture(scope="module")
def config():
    return load_config()  # the CLI's config for the embedded model (--profile auto = cpu)


@pytest.fixture(scope="module")
def server(config, tmp_path_factory):
    served = ServedModel(resolve_model_path(config.model), tmp_path_factory.mktemp("hf_home"))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def tasks(config):
    return load_eval_tasks(config, "dev", limit=LIMIT, seed=0)  # = the CLI's --limit 4


@pytest.fixture(scope="module")
def runtime(config, tasks):
    rt = EnvRuntime(config.env, tasks.db_root)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def local_run(server, config, tasks, runtime):
    """The local model on the same tasks, greedy (runs while the server loads)."""
    policy = load_eval_policy(None, config.model)
    start = time.monotonic()
    run = run_evaluation(tasks.tasks, runtime, policy, CollectorSettings.from_config(config, evaluation=True), EvalOptions())
    return run, time.monotonic() - start


def test_served_model_plays_the_local_episodes(server, local_run, tmp_path, monkeypatch):
    from skyrl_tool_agent.commands.evaluate import main

    local, local_s = local_run
    server.wait_ready()
    out = tmp_path / "served.json"
    monkeypatch.setenv("OPENAI_API_KEY", "")  # a local server needs none
    start = time.monotonic()
    main(["--policy", "openai", "--base-url", f"http://127.0.0.1:{server.port}", "--model", server.model,
          "--limit", str(LIMIT), "--request-timeout", "60", "--max-retries", "2", "--retry-backoff", "0.1",
          "--output", str(out)])
    served_s = time.monotonic() - start
    results = json.loads(out.read_text())
    records = [json.loads(line) for line in Path(results["files"]["trajectories"]).read_text().splitlines()]
    assert "<html" in Path(results["files"]["report"]).read_text()
    # Same metrics and keys as the local run, plus what was served and how.
    assert set(local.results) <= set(results)
    assert results["policy"] == "openai" and results["model_path"] == server.model and results["n"] == LIMIT
    endpoint = results["endpoint"]
    assert endpoint["base_url"] == server.url and endpoint["model"] == server.model
    assert endpoint["served_model"].startswith(server.model) and "api_key" not in json.dumps(endpoint)
    assert (endpoint["timeout_s"], endpoint["max_retries"], endpoint["backoff_s"]) == (60.0, 2, 0.1)
    assert endpoint["failed_turns"] == 0 and endpoint["completion_tokens"] > 0
    assert endpoint["requests"] == sum(s["turns"] for r in records for s in r["samples"])  # one per turn
    # The served episodes are the local ones: same turns, same messages, same outcomes.
    assert [r["task_id"] for r in records] == [r["task_id"] for r in local.records]
    for served_record, local_record in zip(records, local.records):
        served_sample, local_sample = served_record["samples"][0], local_record["samples"][0]
        assert served_sample["messages"] == local_sample["messages"], served_record["task_id"]
        assert served_sample["turns"] == local_sample["turns"] >= 2
        assert (served_sample["solved"], served_sample["final_sql"]) == (local_sample["solved"], local_sample["final_sql"])
    assert any("<tool_call>" in m["content"] for r in records for m in r["samples"][0]["messages"]
               if m["role"] == "assistant")  # structured tool_calls came back as the model's text
    for key in ("execution_accuracy", "exact_match", "valid_sql_rate", "mean_turns", "by_difficulty"):
        assert results[key] == local.results[key], key
    print(f"\nserved: {LIMIT} episodes, EX {results['execution_accuracy']:.3f}, CLI {served_s:.1f} s "
          f"(episodes {results['seconds']:.1f} s, {endpoint['requests']} requests); "
          f"local: EX {local.results['execution_accuracy']:.3f}, {local_s:.1f} s")


def test_a_turn_the_server_cannot_produce_leaves_the_episode_unscored(server, config, tasks, runtime):
    """6 tokens cut the model's first tool call short; transformers serve fails parsing it (HTTP 500).
    A 500 still there after the retries says nothing about the model: the episode ends there,
    unscored (an infra error), never a wrong answer."""
    server.wait_ready()
    endpoint = Endpoint(server.url, server.model, max_retries=1, backoff_s=0.01)
    settings = CollectorSettings(max_turns=2, max_new_tokens_per_turn=6, concurrency=2, max_batch=2)
    run = run_evaluation(tasks.tasks[:2], runtime, endpoint, settings, EvalOptions())
    failed = [s for r in run.records for s in r["samples"]
              if any(m.get("endpoint_error", "").startswith("HTTP 500") for m in s.get("agent_meta", []))]
    assert failed, [s.get("agent_meta") for r in run.records for s in r["samples"]]
    for sample in failed:
        meta = next(m for m in sample["agent_meta"] if "endpoint_error" in m)
        assert meta["attempts"] == 2  # retried once (max_retries=1)
        assert sample["done_reason"] == "error" and sample["error"].startswith("served model, server_error: HTTP 500")
        assert len(sample["messages"]) == 2 + 2 * meta["turn"]  # the turns played before it, nothing after
    assert run.results["infra_errors"] == len(failed) and run.results["scored"] == 2 - len(failed)
    stats = run.results["endpoint"]
    assert stats["protocol_errors"] == {"server_error": len(failed)}
    assert stats["failed_turns"] >= len(failed) and stats["retries"] >= stats["failed_turns"]


def test_model_may_be_named_as_the_server_reports_it(server):
    """`transformers serve DIR` answers as `DIR@main`; `--model DIR@main` or `--model <DIR's name>` serve too."""
    from skyrl_tool_agent.rollout.openai_agent import probe_endpoint

    server.wait_ready()
    reported = probe_endpoint(Endpoint(server.url, server.model))["served_model"]
    assert reported == f"{server.model}@main"
    for name in (reported, Path(server.model).name):
        endpoint = Endpoint(server.url, name)
        assert probe_endpoint(endpoint)["model"] == server.model, name
        assert probe_endpoint(endpoint)["models"] is None  # no hub cache: the listing failed (HTTP 500)


def test_dead_server_or_unknown_model_is_one_error_line(server, tmp_path, capsys):
    from skyrl_tool_agent.commands.evaluate import main

    server.wait_ready()
    out = tmp_path / "r.json"
    cases = {f"http://127.0.0.1:{_free_port()}/v1": ("x", "cannot reach http://127.0.0.1:"),
             server.url: ("no-such-model", "answered HTTP 400 for model 'no-such-model': Server is pinned to")}
    for url, (model, message) in cases.items():
        with pytest.raises(SystemExit) as info:
            main(["--policy", "openai", "--base-url", url, "--model", model, "--limit", "2", "--output", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and err[-1].startswith("error: ") and message in err[-1], err
        assert not any("Traceback" in line for line in err) and not out.exists()


# ------------------------------------------------------------------ a scripted stdlib HTTP server
class ScriptedServer(ThreadingHTTPServer):
    """Answers POST /v1/chat/completions from `script` (status, body, delay), the last entry
    repeating; GET /v1/models lists `models`. Records each request's arrival, headers and body."""

    daemon_threads = True

    def __init__(self, script: list[tuple[int, object, float]], models: tuple[str, ...] = ("m",)) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script, self.models, self.hits = list(script), models, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: object) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # http.server's naming
        self._send(200, {"object": "list", "data": [{"id": m} for m in self.server.models]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.hits.append((time.monotonic(), dict(self.headers), body))
        status, reply, delay = self.server.script.pop(0) if len(self.server.script) > 1 else self.server.script[0]
        time.sleep(delay)
        try:
            self._send(status, reply)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            pass


def _completion(content: str | None, tool_calls: list | None = None, finish: str = "stop") -> dict:
    message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"id": "x", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": message,
            "finish_reason": finish}], "usage": {"prompt_tokens": 10, "completion_tokens": 3}}


def _request(turn: int = 0) -> TurnRequest:
    task = Task(task_id="t-1", db_id="shop", question="How many orders?", gold_sql="SELECT 1", difficulty="easy")
    return TurnRequest(task, 0, [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], None, 32, turn)


def _act(agent: OpenAIChatAgent, *requests: TurnRequest):
    async def go():
        try:
            return await agent.act(list(requests or [_request()]))
        finally:
            await agent.aclose()
    return asyncio.run(go())


def test_retries_back_off_exponentially_then_succeed():
    call = {"id": "c0", "type": "function", "function": {"name": "execute_sql", "arguments": '{"sql": "SELECT 1"}'}}
    script = [(429, {"error": {"message": "slow down"}}, 0.0), (503, "busy", 0.0), (200, _completion("", [call]), 0.0)]
    with ScriptedServer(script) as http:
        agent = make_agent(Endpoint(http.url, "m", api_key="k-123", backoff_s=0.2, max_retries=3),
                           SamplingParams(temperature=0.7, top_p=0.9), seed=3)
        [turn] = _act(agent)
    assert isinstance(agent, OpenAIChatAgent)
    assert turn.text == '<tool_call>\n{"name": "execute_sql", "arguments": {"sql": "SELECT 1"}}\n</tool_call>'
    assert turn.meta == {"attempts": 3}
    assert agent.stats["requests"] == 3 and agent.stats["retries"] == 2 and agent.stats["failed_turns"] == 0
    times = [t for t, _, _ in http.hits]
    first, second = times[1] - times[0], times[2] - times[1]
    assert 0.2 <= first < 0.35 and 0.4 <= second < 0.6  # backoff_s, then twice that
    _, headers, body = http.hits[0]
    assert headers["Authorization"] == "Bearer k-123"
    assert (body["model"], body["temperature"], body["top_p"], body["max_tokens"]) == ("m", 0.7, 0.9, 32)
    assert isinstance(body["seed"], int) and body["messages"] == _request().messages


def test_turn_failures_and_fatal_errors():
    turn_failures = [  # the server answered, but not this turn: the turn fails, the evaluation goes on
        (503, "overloaded", "HTTP 503: overloaded", 3),  # retried max_retries=2 times
        (400, {"error": {"message": "context too long"}}, "HTTP 400: context too long", 1),  # not retried
    ]
    for status, body, error, attempts in turn_failures:
        with ScriptedServer([(status, body, 0.0)]) as http:
            agent = make_agent(Endpoint(http.url, "m", max_retries=2, backoff_s=0.01), GREEDY)
            [turn] = _act(agent)
            assert "seed" not in http.hits[0][2]  # greedy: nothing to seed
        assert (turn.text, turn.meta) == ("", {"endpoint_error": error, "attempts": attempts})
        assert agent.stats["failed_turns"] == 1 and agent.stats["requests"] == attempts
    fatal = {  # nothing later would go better: one EndpointError
        "rate": ([(429, "no", 0.0)], {}, "still rate-limits after 2 attempts"),
        "key": ([(401, {"error": {"message": "bad key"}}, 0.0)], {}, "HTTP 401 for model 'm': bad key (check the API key)"),
        "timeout": ([(200, _completion("late"), 1.0)], {"timeout_s": 0.3}, "stopped answering (ReadTimeout"),
    }
    for name, (script, extra, message) in fatal.items():
        with ScriptedServer(script) as http:
            agent = make_agent(Endpoint(http.url, "m", max_retries=1, backoff_s=0.01, **extra))
            with pytest.raises(EndpointError) as info:
                _act(agent)
        assert message in str(info.value), (name, str(info.value))
        assert len(http.hits) == (1 if name == "key" else 2), name
    dead = Endpoint(f"http://127.0.0.1:{_free_port()}", "m", max_retries=1, backoff_s=0.01)
    with pytest.raises(EndpointError, match="stopped answering .ConnectError"):
        _act(make_agent(dead))


def test_probe_and_settings(monkeypatch):
    from skyrl_tool_agent.rollout.openai_agent import probe_endpoint

    with ScriptedServer([(200, _completion("ok"), 0.0)], models=("a", "b")) as http:
        with pytest.raises(EndpointError, match="model 'c' is not served at .*; it serves: a, b"):
            probe_endpoint(Endpoint(http.url, "c"))
        assert probe_endpoint(Endpoint(http.url, "b")) == {"models": ["a", "b"], "served_model": "m", "model": "b"}
        assert http.hits[-1][2]["max_tokens"] == 1
    with ScriptedServer([(200, "not json", 0.0)]) as http, pytest.raises(EndpointError, match="chat-completions format"):
        probe_endpoint(Endpoint(http.url, "m"))
    assert Endpoint("http://h:8000", "m").base_url == "http://h:8000/v1"  # no path: the usual /v1
    assert Endpoint("https://h/openai/v1/", "m").base_url == "https://h/openai/v1"
    with pytest.raises(EndpointError, match="give an http"):
        Endpoint("localhost:8000", "m")
    with pytest.raises(EndpointError, match="timeout_s must be > 0"):
        Endpoint("http://h", "m", timeout_s=0)
    monkeypatch.setenv("MY_KEY", "s3cret")
    keyed = Endpoint.from_env("http://h", "m", api_key_env="MY_KEY")
    assert keyed.api_key == "s3cret" and "s3cret" not in repr(keyed) and "s3cret" not in json.dumps(keyed.describe())
    assert Endpoint.from_env("http://h", "m", api_key_env="UNSET_KEY_VAR").api_key is None
    assert isinstance(make_agent("oracle"), OracleAgent)
    oracle = OracleAgent()
    assert make_agent(oracle) is oracle
    with pytest.raises(ValueError, match="unknown policy"):
        make_agent("gpt")


def test_structured_replies_become_the_models_text():
    calls = [{"function": {"name": "execute_sql", "arguments": '{"sql": "SELECT \'é\'"}'}},
             {"function": {"name": "list_tables", "arguments": "{not json"}}]
    assert message_text({"content": "Let me look.\n", "tool_calls": calls}) == (
        "Let me look.\n<tool_call>\n{\"name\": \"execute_sql\", \"arguments\": {\"sql\": \"SELECT 'é'\"}}\n</tool_call>"
        "\n<tool_call>\n{\"name\": \"list_tables\", \"arguments\": {not json}\n</tool_call>")
    assert message_text({"content": "<answer>SELECT 1</answer>", "reasoning_content": "easy"}) == (
        "<think>\neasy\n</think>\n\n<answer>SELECT 1</answer>")
    assert message_text({"content": None}) == ""
