"""`evaluate --policy openai` against a hostile server: a real HTTP server on loopback (a thread of the
test process, HTTP/1.1, real sockets) that answers each episode's requests in one of the ways an
attacker found to hang, bloat or crash an evaluation, chosen by the episode's question.

- malformed answers (`message` null, `tool_calls` a string, `usage` counts that are not integers,
  nesting deeper than any parser allows, ...) and infrastructure faults (HTTP 500 after the
  retries, a body that is not JSON or not a chat completion) end their episode unscored, with the
  reason, while the other episodes of the same evaluation are scored: through the real evaluation
  (`run_evaluation`, the real collector and MCP env);
- oversized answers (a gzip bomb, bodies of tens of MB with and without Content-Length, a stream
  that never ends, a turn's text over its cap) are refused at their cap: the CLI, in a subprocess,
  finishes, and its peak RSS (VmHWM) stays near that of an evaluation served well-formed answers;
- a server that drips its answer, or streams one forever, slowly, is cut at the request deadline
  (connect to last byte): the CLI ends with one `error:` line within the retries' deadlines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Callable
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import pytest

from skyrl_tool_agent.config import load_config
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.evaluate import EvalOptions, run_evaluation
from skyrl_tool_agent.eval.splits import load_eval_tasks
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.openai_agent import Endpoint

REPO_ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024


# ------------------------------------------------------------------ answers
def _completion(message: object, **extra: object) -> dict:
    return {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3}, **extra}


def _said(content: object = "<answer>SELECT 1</answer>", **fields: object) -> dict:
    return _completion({"role": "assistant", "content": content, **fields})


def _call(function: object) -> dict:
    return _said(None, tool_calls=[{"id": "c0", "type": "function", "function": function}])


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


#: A well-formed answer: the episode is scored.
OK = json.dumps(_said()).encode()

#: Malformed answers (on the old code a traceback each, but for `content` a number: a wrong answer):
#: the episode is unscored, "malformed"; except deep nesting inside a tool call's arguments string,
#: which is the model's text: the env answers it with a format error, as when a local model writes it.
MALFORMED = {
    "message null": json.dumps(_completion(None)),
    "message a string": json.dumps(_completion("SELECT 1")),
    "tool_calls a string": json.dumps(_said(None, tool_calls="execute_sql")),
    "tool_calls holding null": json.dumps(_said(None, tool_calls=[None])),
    "function a string": json.dumps(_call("execute_sql")),
    "function a list": json.dumps(_call(["execute_sql"])),
    "usage a string": json.dumps({**_said(), "usage": "12 tokens"}),
    "usage count a word": json.dumps({**_said(), "usage": {"prompt_tokens": "twelve"}}),
    "usage count an object": json.dumps({**_said(), "usage": {"completion_tokens": {"n": 3}}}),
    "content a number": json.dumps(_said(42)),
    "content nested 100k deep": b'{"choices":[{"index":0,"message":{"role":"assistant","content":'
                                + _deep(100_000) + b'},"finish_reason":"stop"}]}',
    "arguments nested 100k deep": b'{"choices":[{"index":0,"message":{"role":"assistant","content":null,'
                                  b'"tool_calls":[{"function":{"name":"execute_sql","arguments":{"sql":'
                                  + _deep(100_000) + b'}}}]},"finish_reason":"stop"}]}',
    "arguments string nested 5k deep": json.dumps(_call({"name": "execute_sql", "arguments": _deep(5_000).decode()})),
}
MODEL_TEXT = {"arguments string nested 5k deep"}

#: Infrastructure faults (each scored as a wrong answer on the old code): unscored, with the reason;
#: beside them, well-formed answers compressed as servers may send them: scored.
INFRA = {
    "well-formed, gzip": "scored",
    "well-formed, deflate": "scored",
    "well-formed, raw deflate": "scored",
    "HTTP 500 on every retry": "server_error",
    "not JSON": "malformed",
    "an empty object": "malformed",
    "no choices": "malformed",
    "choices an object": "malformed",
    "a 16 MB garbage body": "too_large",
}

#: Oversized answers: refused at a cap ("too_large"), memory bounded.
OVERSIZED = ("a gzip bomb (64 MiB inflated)", "48 MB of content, Content-Length declared",
             "24 MB of invalid JSON, chunked", "24 MB of tool-call arguments, chunked",
             "1 MiB of content (under the body cap, over the turn's)", "a fast stream that never ends")

#: Stalls: bounded by the request deadline.
STALLS = ("a byte every 0.2 s", "a chunk every 0.2 s, forever")


@cache
def _gzip_bomb(inflated: int = 64 * MiB) -> bytes:
    """A chat completion whose content is `inflated` bytes of "a", gzipped (about 1/1000 the size)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"'
    parts = [packer.compress(head)]
    block = b"a" * MiB
    parts += [packer.compress(block) for _ in range(inflated // MiB)]
    parts += [packer.compress(b'"},"finish_reason":"stop"}]}'), packer.flush()]
    return b"".join(parts)


# ------------------------------------------------------------------ the server
class HostileServer(ThreadingHTTPServer):
    """POST /v1/chat/completions answers as `modes[question]` for the episode whose first user
    message holds `question` (well-formed otherwise), and the 1-token probe as `probe`; GET
    /v1/models lists "m". Records (arrival, mode) of every chat request."""

    daemon_threads = True

    def __init__(self, modes: dict[str, str], probe: str = "ok") -> None:
        super().__init__(("127.0.0.1", 0), _Hostile)
        self.modes, self.probe = modes, probe
        self.hits: list[tuple[float, str]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def mode_of(self, request: dict) -> str:
        if request.get("max_tokens") == 1:
            return self.probe
        user = next((m["content"] for m in request.get("messages", []) if m["role"] == "user"), "")
        return next((mode for question, mode in self.modes.items() if question in user), "ok")

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is what the caps are for
            super().handle_error(request, client_address)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Hostile(BaseHTTPRequestHandler):
    server: HostileServer
    protocol_version = "HTTP/1.1"  # chunked bodies, kept-alive connections

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # http.server's naming
        self._send(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self.server.mode_of(request)
        self.server.hits.append((time.monotonic(), mode))
        try:
            ANSWERS[mode](self)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: what the caps are for
            self.close_connection = True

    def _send(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _chunked(self, chunks: Callable[[], bytes | None], pause_s: float = 0.0) -> None:
        """A chunked 200 answer: `chunks()` until it returns None."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while (chunk := chunks()) is not None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
            time.sleep(pause_s)
        self.wfile.write(b"0\r\n\r\n")

    def _drip(self) -> None:
        """The Content-Length up front, then one byte every 0.2 s: each gap far under any timeout."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(OK)))
        self.end_headers()
        for i in range(len(OK)):
            self.wfile.write(OK[i:i + 1])
            self.wfile.flush()
            time.sleep(0.2)

    def _sized(self, total: int, piece: bytes, head: bytes = b"", tail: bytes = b"") -> None:
        """`head`, `piece` repeated to about `total` bytes, `tail`: chunked, no length announced."""
        left = [part for part in (head, *[piece] * (total // len(piece)), tail) if part]  # b"" would end the body
        self._chunked(lambda: left.pop(0) if left else None)


def _tool_args_answer(handler: _Hostile, total: int) -> None:
    head = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"function":'
            b'{"name":"execute_sql","arguments":"')
    handler._sized(total, b"x" * MiB, head, b'"}}]},"finish_reason":"stop"}]}')


def _flood(handler: _Hostile) -> None:
    sent = [0]

    def chunk() -> bytes | None:  # a server that would never stop; this one stops at 64 MiB (the old code reads it all)
        sent[0] += 1
        return b" " * (256 * 1024) if sent[0] <= 256 else None
    handler._chunked(chunk)


ANSWERS: dict[str, Callable[[_Hostile], None]] = {
    "ok": lambda h: h._send(200, OK),
    "well-formed, gzip": lambda h: h._send(200, zlib.compress(OK, wbits=16 + zlib.MAX_WBITS), Content_Encoding="gzip"),
    "well-formed, deflate": lambda h: h._send(200, zlib.compress(OK), Content_Encoding="deflate"),
    "well-formed, raw deflate": lambda h: h._send(200, zlib.compress(OK, wbits=-zlib.MAX_WBITS), Content_Encoding="deflate"),
    **{name: (lambda body: lambda h: h._send(200, body if isinstance(body, bytes) else body.encode()))(body)
       for name, body in MALFORMED.items()},
    "HTTP 500 on every retry": lambda h: h._send(500, b'{"error": {"message": "boom"}}'),
    "not JSON": lambda h: h._send(200, b"<html>upstream hiccup</html>"),
    "an empty object": lambda h: h._send(200, b"{}"),
    "no choices": lambda h: h._send(200, json.dumps({"id": "x", "object": "chat.completion"}).encode()),
    "choices an object": lambda h: h._send(200, json.dumps({"choices": _said()["choices"][0]}).encode()),
    "a 16 MB garbage body": lambda h: h._sized(16 * MiB, b"garbage " * (MiB // 8)),
    OVERSIZED[0]: lambda h: h._send(200, _gzip_bomb(), Content_Encoding="gzip"),
    OVERSIZED[1]: lambda h: h._send(200, json.dumps(_said("a" * (48 * MiB))).encode()),
    OVERSIZED[2]: lambda h: h._sized(24 * MiB, b"x" * MiB, b'{"choices": '),
    OVERSIZED[3]: lambda h: _tool_args_answer(h, 24 * MiB),
    OVERSIZED[4]: lambda h: h._send(200, json.dumps(_said("a" * MiB)).encode()),
    OVERSIZED[5]: _flood,
    STALLS[0]: _Hostile._drip,
    STALLS[1]: lambda h: h._chunked(lambda: b" ", pause_s=0.2),
}


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def config():
    return load_config()


@pytest.fixture(scope="module")
def dev_tasks(config) -> list[Task]:
    return load_eval_tasks(config, "dev", limit=len(MALFORMED) + 1, seed=0).tasks  # = the CLI's --limit N


@pytest.fixture(scope="module")
def runtime(config):
    rt = EnvRuntime(config.env, load_eval_tasks(config, "dev", limit=1).db_root)
    yield rt
    rt.close()


def _modes(tasks: list[Task], modes: list[str]) -> dict[str, str]:
    """The first task well served (a scored control), the next ones one mode each."""
    assert len(tasks) > len(modes)
    return {task.question: mode for task, mode in zip(tasks[1:], modes)}


# ------------------------------------------------------------------ per-episode outcomes
@pytest.mark.parametrize("kind", ["malformed", "infrastructure"])
def test_bad_answers_leave_their_episode_unscored(kind, dev_tasks, runtime):
    """One evaluation, one episode per bad answer beside a well-served one: no exception ends it,
    each bad episode is an infra error with its reason (never a wrong answer), the control is scored."""
    expected = ({name: "format error" if name in MODEL_TEXT else "malformed" for name in MALFORMED}
                if kind == "malformed" else INFRA)
    tasks = dev_tasks[: len(expected) + 1]
    with HostileServer(_modes(tasks, list(expected))) as http:
        endpoint = Endpoint(http.url, "m", timeout_s=5, max_retries=1, backoff_s=0.01)
        settings = CollectorSettings(max_turns=2, max_new_tokens_per_turn=64, concurrency=8, max_batch=8)
        start = time.monotonic()
        run = run_evaluation(tasks, runtime, endpoint, settings, EvalOptions())
        seconds = time.monotonic() - start
    by_question = {r["question"]: r for r in run.records}
    control = by_question[tasks[0].question]
    assert control["scored"] and control["samples"][0]["done_reason"] == "answer"
    outcome = {}
    for question, name in http.modes.items():
        sample = by_question[question]["samples"][0]
        if sample["done_reason"] == "error":
            outcome[name] = sample["error"]
        else:
            outcome[name] = "format error" if sample["format_errors"] else "scored"
    for name, reason in expected.items():
        if reason in ("format error", "scored"):
            assert outcome[name] == reason, (name, outcome[name])
        else:
            assert outcome[name].startswith(f"served model, {reason}: "), (name, outcome[name])
            assert len(outcome[name]) < 400 and "\n" not in outcome[name], outcome[name]  # one line
    unscored = sum(reason not in ("format error", "scored") for reason in expected.values())
    results = run.results
    assert (results["infra_errors"], results["scored"]) == (unscored, len(tasks) - unscored)
    counted = {r: n for r in ("server_error", "too_large", "malformed")
               if (n := sum(v == r for v in expected.values()))}
    assert results["endpoint"]["protocol_errors"] == counted
    print(f"\n{kind}: {len(expected)} answers, {seconds:.1f} s: " + "; ".join(f"{k}: {v}" for k, v in outcome.items()))


# ------------------------------------------------------------------ the CLI, in a subprocess
class CLIRun:
    """`skyrl-tool-agent eval --policy openai` against `server`, started in a subprocess; `finish()`
    waits for it: exit status (None: still running at `timeout_s`, killed), stdout, stderr, and its
    peak RSS in KiB (VmHWM, printed by the process as it exits)."""

    def __init__(self, server: HostileServer, out: Path, limit: int, *extra: str) -> None:
        argv = ["--policy", "openai", "--base-url", server.url, "--model", "m", "--limit", str(limit),
                "--output", str(out), "--no-report", "--max-turns", "2", *extra]
        code = textwrap.dedent(f"""
            import sys
            from skyrl_tool_agent.commands.evaluate import main
            try:
                main({argv!r})
            finally:
                peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
                print("peak-rss-kib", peak.split()[1], file=sys.stderr)
        """)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OPENAI_API_KEY": "", "WANDB_MODE": "offline",
               "WEAVE_DISABLED": "true", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.code: int | None = None
        self.stdout = self.stderr = ""
        self.peak_kib = 0
        self.ended = 0.0

    def finish(self, timeout_s: float) -> CLIRun:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout_s)
            self.code = self.proc.returncode
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
        self.ended = time.monotonic()
        self.peak_kib = int(next((line.split()[1] for line in self.stderr.splitlines()
                                  if line.startswith("peak-rss-kib")), 0))
        return self


def test_oversized_answers_stop_at_their_cap(config, tmp_path):
    """Six oversized answers beside a well-served episode, through the CLI: it finishes, each is an
    unscored `too_large` episode, the files stay small, and the peak RSS stays within 64 MiB (six
    bodies at their 4 MiB cap, each joined once, and slack) of the same evaluation served only
    well-formed answers."""
    tasks = load_eval_tasks(config, "dev", limit=len(OVERSIZED) + 1, seed=0).tasks
    _gzip_bomb()  # built before the runs start
    with HostileServer({}) as calm_server:
        calm = CLIRun(calm_server, tmp_path / "calm.json", len(tasks)).finish(timeout_s=60)
    with HostileServer(_modes(tasks, list(OVERSIZED))) as http:
        out = tmp_path / "results.json"
        run = CLIRun(http, out, len(tasks)).finish(timeout_s=90)
    assert calm.code == 0, calm.stderr[-2000:]
    assert run.code == 0 and "Traceback" not in run.stderr, (run.code, run.stderr[-3000:])
    results = json.loads(out.read_text())
    trajectories = Path(results["files"]["trajectories"])
    records = {r["question"]: r for r in map(json.loads, trajectories.read_text().splitlines())}
    for question, name in http.modes.items():
        sample = records[question]["samples"][0]
        assert sample["done_reason"] == "error" and sample["error"].startswith("served model, too_large: "), (name, sample)
    assert results["infra_errors"] == len(OVERSIZED) and results["scored"] == 1
    assert results["endpoint"]["protocol_errors"] == {"too_large": len(OVERSIZED)}
    assert f"episodes unscored by its answers: too_large {len(OVERSIZED)}" in " ".join(run.stdout.split()), run.stdout
    assert trajectories.stat().st_size < 256 * 1024
    assert run.peak_kib - calm.peak_kib < 64 * 1024, (run.peak_kib, calm.peak_kib)
    print(f"\noversized: peak RSS {run.peak_kib / 1024:.0f} MiB (well-formed answers: {calm.peak_kib / 1024:.0f} MiB); "
          + "; ".join(f"{name}: {records[q]['samples'][0]['error']}" for q, name in http.modes.items()))


@pytest.mark.parametrize("stalled", ["episodes", "probe"])
def test_a_stalling_server_is_cut_at_the_deadline(stalled, config, tmp_path):
    """--request-timeout 1 --max-retries 1 against answers that drip a byte every 0.2 s or stream a
    chunk every 0.2 s forever (one episode each; or the probe dripping): each request is cut 1 s
    after it was sent, retried once (the probe: not retried), then the evaluation ends with one
    `error:` line (exit 2), where the old code ran as long as the server kept sending."""
    tasks = load_eval_tasks(config, "dev", limit=2, seed=0).tasks
    modes, probe = ({}, STALLS[0]) if stalled == "probe" else (dict(zip((t.question for t in tasks), STALLS)), "ok")
    with HostileServer(modes, probe=probe) as http:
        run = CLIRun(http, tmp_path / "r.json", len(tasks), "--request-timeout", "1", "--max-retries", "1",
                     "--retry-backoff", "0.1").finish(timeout_s=40)
        hits = list(http.hits)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.code == 2 and "Traceback" not in run.stderr and len(errors) == 1, (run.code, run.stderr[-2000:])
    assert "no complete answer within 1 s" in errors[0], errors
    stalls = {mode: [t for t, m in hits if m == mode] for mode in STALLS if mode in (probe, *modes.values())}
    for mode, times in stalls.items():  # a retry is sent once the deadline cut the first attempt
        assert times and all(later - earlier < 1.1 + 0.5 for earlier, later in zip(times, times[1:])), (mode, hits)
    first = min(t for times in stalls.values() for t in times)
    attempts = 1 if stalled == "probe" else 2
    # + slack for the process to end (its MCP servers stop) on a busy machine
    assert run.ended - first < attempts * 1.0 + 0.1 + 3.5, (run.ended - first, hits)
    print(f"\nstalled {stalled}: the CLI ended {run.ended - first:.1f} s after the first stalled request: {errors[0]}")
