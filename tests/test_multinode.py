"""Two "nodes" on one machine: what a 2 x 8 GPU launch relies on, checked with 2 + 1 gloo ranks.

Each node is its own `torchrun --nnodes 2 --node_rank N --master_addr 127.0.0.1` launcher: node 0
of 2 ranks (0 and 1: rank 0 and a rank that is not, side by side), node 1 of 1 (rank 2, whose
LOCAL_RANK is 0; the faults' launches 1 + 1) on the tiny model, with its own working
directory, temporary directory, model cache and PYTHONHASHSEED: what differs between real nodes.
Each launch runs in its own process group, killed whole on a timeout.

One uninterrupted full-mode launch (DeepSpeed ZeRO-3, 4 steps of 5 tasks on 3 ranks, by the
DeepSpeed launcher's multi-node form without ssh) carries the run's assertions; the same run
launched by torchrun is stopped twice, as a cluster stops a job (SIGTERM to both launchers during
step 1, then, resumed on both nodes, node 1's rank killed after its step-2 checkpoint); the
resumed launch's last checkpoint holds the uninterrupted run's state at that step, tensor for
tensor on every rank. Each planted fault (one more `--set` on node
1, each node its own output directory, another task file on node 1) is a launch of one rank per
node that must stop every rank before any work with one line naming it. The faults run in LoRA
mode (`ReplicatedBackend`), so both backends' launch checks run; LoRA's training over ranks is the
same `DataParallelTrainer` with rank 0's checkpoints, resumed on every rank in
tests/test_data_parallel.py's launch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.fixtures.distributed import (
    REPO,
    SCRIPT,
    free_port,
    launch_env,
    launched_rows,
    metrics_rows,
    tiny_run_args,
)

#: Ranks of node 0 and node 1 in the launches that train: two ranks side by side on one node, one
#: rank on another (LOCAL_RANK 0, RANK 2), each with node-local directories; a killed rank's
#: survivors are rank 0 and one that is not. A planted fault's launch has one rank per node
#: (`FAULT_RANKS`): rank 1 is then another node's LOCAL_RANK 0, all a fault needs. (Each rank
#: costs its start-up, ~6 CPU-s, imports mostly: 2 x 2 cost a third more for nothing 2 + 1 misses.
#: torchrun and DeepSpeed's hostfile take a rank count per node.)
RANKS = (2, 1)
FAULT_RANKS = (1, 1)
#: A failing launch's every rank stops with this many seconds of slack after the cause; a
#: launch that trains has `TRAIN_TIMEOUT_S`.
STOP_TIMEOUT_S = 120
TRAIN_TIMEOUT_S = 400
#: Tasks per step: not a multiple of the 3 ranks, so ranks roll out 2 or 1 task.
TASKS_PER_STEP = 5
#: Steps of the runs that train: the interrupted one has node 1's rank killed after its step-2
#: checkpoint, with room for the steps a quiet machine finishes before the kill lands, so it is
#: always cut before its end.
STEPS = 4


@dataclass(frozen=True)
class Node:
    """One simulated node: its rank among the nodes and the directories only it uses."""

    rank: int
    root: Path

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def env(self) -> dict[str, str]:
        cache = self.root / "cache"
        return {**launch_env(self.root / "torch_extensions"), "TMPDIR": str(self.tmp), "HF_HOME": str(cache / "hf"),
                "XDG_CACHE_HOME": str(cache), "PYTHONHASHSEED": str(1000 + self.rank)}

    def processes(self, tiny: Path) -> list[psutil.Process]:
        """The processes this node's launches started: launchers, ranks and watchdogs (its TMPDIR in
        their environment), and any MCP server on `tiny`'s databases (servers get a minimal
        environment; the launches run one at a time, so a server left running is a leak whichever
        node it came from)."""
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("TMPDIR") == str(self.tmp) or is_server(proc, tiny):
                    found.append(proc)
        return found

    def run_dirs(self) -> list[Path]:
        return sorted((self.tmp / "skyrl-tool-agent").glob("run-*"))


@dataclass
class Launched:
    node: Node
    returncode: int
    stdout: str
    stderr: str

    @property
    def log(self) -> str:
        return self.stdout + self.stderr

    def completed(self) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess([], self.returncode, self.stdout, self.stderr)


def make_nodes(root: Path) -> list[Node]:
    nodes = [Node(rank, root / f"node{rank}") for rank in range(2)]
    for node in nodes:
        for path in (node.cwd, node.tmp, node.root / "cache"):
            path.mkdir(parents=True, exist_ok=True)
    return nodes


def launcher(kind: str, node: Node, port: int, ranks: tuple[int, int] = RANKS) -> list[str]:
    """Node `node`'s launcher command: `torchrun --nnodes 2 --node_rank N`, or ("deepspeed") the
    DeepSpeed launcher's multi-node form without ssh, each node starting its own ranks from a
    hostfile that names both (`deepspeed --hostfile H --no_ssh --node_rank N`, DeepSpeed >= 0.15).
    `ranks`: each node's rank count."""
    head = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", str(ranks[node.rank])]
    if kind == "deepspeed":
        hostfile = node.root / "hostfile"
        hostfile.write_text("".join(f"node-{name} slots={n}\n" for name, n in zip("ab", ranks, strict=True)))
        head = [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_ssh", "--quiet"]
    return [*head, "--node_rank", str(node.rank), "--master_addr", "127.0.0.1", "--master_port", str(port)]


def launch_nodes(nodes: list[Node], args: list[str], *, timeout: float, node1_args: tuple[str, ...] = (),
                 while_running: Callable[[list[subprocess.Popen]], None] | None = None,
                 kind: str = "torchrun", ranks: tuple[int, int] = RANKS) -> list[Launched]:
    """Both nodes' launchers (`launcher(kind)`, node N of `ranks[N]` ranks) of `train_grpo.py args` (node 1 with `node1_args`
    after them), each in its own working directory and process group; `while_running(launchers)`
    is called about every half second until both have exited. On a timeout (or any exception) both
    groups are killed."""
    port = free_port()
    procs, logs = [], []
    for node in nodes:
        cmd = [*launcher(kind, node, port, ranks), str(SCRIPT), *args, *(node1_args if node.rank == 1 else ())]
        out, err = (node.root / f"launch-{port}.out").open("w+"), (node.root / f"launch-{port}.err").open("w+")
        logs.append((out, err))
        procs.append(subprocess.Popen(cmd, env=node.env(), cwd=node.cwd, stdout=out, stderr=err, text=True,
                                      start_new_session=True))
    try:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the two nodes' launch did not end within {timeout} s")
            if while_running is not None:
                while_running(procs)
            time.sleep(0.5)
    except BaseException:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        raise
    launched = []
    for node, proc, (out, err) in zip(nodes, procs, logs, strict=True):
        out.seek(0)
        err.seek(0)
        launched.append(Launched(node, proc.returncode, out.read(), err.read()))
        out.close()
        err.close()
    return launched


def is_server(proc: psutil.Process, tiny: Path) -> bool:
    """Whether `proc` is an MCP server of a run on `tiny`'s databases."""
    cmdline = proc.cmdline()
    return "mcp_tools.sqlite_server" in cmdline and str(tiny / "dbs") in cmdline


def leftovers(nodes: list[Node], tiny: Path, within_s: float = 30.0) -> list[tuple[int, list[int], list[Path]]]:
    """Per node, the pids and run directories still there once the launchers have exited: the
    watchdogs of ranks that died clean up as they notice (a moment later), so this waits up to
    `within_s` for them to go."""
    deadline = time.monotonic() + within_s
    while True:
        left = [(node.rank, [p.pid for p in node.processes(tiny)], node.run_dirs()) for node in nodes]
        if all(not pids and not dirs for _, pids, dirs in left) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def kill_leftovers(nodes: list[Node], tiny: Path) -> None:
    for node in nodes:
        for proc in node.processes(tiny):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def error_lines(launched: Launched) -> list[str]:
    return [line for line in launched.stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture(scope="module")
def tiny(tiny_run):
    """The session's tiny run directory (tests/conftest.py), the one test_deepspeed and
    test_data_parallel launch on: built once per test process, only read."""
    return tiny_run


def cluster_args(tiny: Path, mode: str, max_steps: int = 2) -> list[str]:
    return [*tiny_run_args(tiny, mode, max_steps=max_steps), "--set", f"training.tasks_per_step={TASKS_PER_STEP}"]


@dataclass
class Watch:
    """What `while_running` saw: each node's MCP servers and run directories at their most."""

    servers: list[int]
    run_dirs: list[int]

    def look(self, nodes: list[Node], launchers: list[subprocess.Popen], tiny: Path) -> None:
        for node, launcher in zip(nodes, launchers, strict=True):
            with contextlib.suppress(psutil.Error):
                servers = [p for p in psutil.Process(launcher.pid).children(recursive=True) if is_server(p, tiny)]
                self.servers[node.rank] = max(self.servers[node.rank], len(servers))
            self.run_dirs[node.rank] = max(self.run_dirs[node.rank], len(node.run_dirs()))


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory):
    """The uninterrupted `STEPS`-step launch into a shared output directory, by the DeepSpeed
    launcher's multi-node form without ssh (the other launches are torchrun's): (nodes, launched,
    output, watch, what is left after it)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    nodes, out, watch = make_nodes(root), root / "shared" / "run", Watch([0, 0], [0, 0])
    try:
        launched = launch_nodes(nodes, [*cluster_args(tiny, "full", max_steps=STEPS), "--output-dir", str(out)],
                                timeout=TRAIN_TIMEOUT_S, while_running=lambda launchers: watch.look(nodes, launchers, tiny),
                                kind="deepspeed")
        yield nodes, launched, out, watch, leftovers(nodes, tiny)
    finally:
        kill_leftovers(nodes, tiny)


@dataclass
class Stopped:
    """One launch of the interrupted run that was stopped: what the launchers said, seconds from the
    signal or the kill to both launchers' end, what was left, and its last checkpoint's step."""

    launched: list[Launched]
    seconds: float
    left: list[tuple[int, list[int], list[Path]]]
    last: int
    spent_s: float  # the last checkpoint's time budget clock, read before a resume may rotate it away
    steps_logged: list[int]  # metrics.jsonl's steps then
    finished: bool  # whether final/ was there


@pytest.fixture(scope="module")
def interrupted(tiny, tmp_path_factory):
    """The uninterrupted run's settings launched by torchrun and stopped twice, as a cluster stops
    a job: SIGTERM to both launchers during step 1 (a scheduler's stop), then, resumed on both
    nodes (`--resume auto`), node 1's rank (global rank 2) killed once the step-2 checkpoint is
    written (a lost node). (nodes, output, the SIGTERM stop, the kill stop.) A third launch resumed
    to the end would prove again what the second proves (a resume, now checked at its last
    checkpoint against the uninterrupted run's) for one more launch of 3 ranks (~26 CPU-s)."""
    root = tmp_path_factory.mktemp("interrupted")
    nodes, out = make_nodes(root), root / "shared" / "run"
    args = [*cluster_args(tiny, "full", max_steps=STEPS), "--output-dir", str(out)]
    signalled_at: list[float] = []

    def stop_mid_step(launchers: list[subprocess.Popen]) -> None:
        # Step 1 is under way once rank 0 has written the run's report after step 0's evaluation (the
        # last of its files; metrics.jsonl's row comes before that writing, during which a signal
        # stops the run after step 0).
        if signalled_at or not (out / "report.html").is_file():
            return
        for launcher in launchers:
            launcher.send_signal(signal.SIGTERM)
        signalled_at.append(time.monotonic())

    def kill_rank_2(_launchers: list[subprocess.Popen]) -> None:
        if len(signalled_at) > 1 or not (out / "checkpoints" / "step-000002").is_dir():
            return
        for proc in nodes[1].processes(tiny):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("RANK") == "2" and str(SCRIPT) in proc.cmdline():
                    proc.kill()
                    signalled_at.append(time.monotonic())

    def stopped(launched: list[Launched]) -> Stopped:
        seconds = time.monotonic() - signalled_at[-1]
        last = max(int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*")
                   if p.is_dir() and not p.name.endswith(".tmp"))
        spent = json.loads((out / "checkpoints" / f"step-{last:06d}" / "trainer_state.json").read_text())["elapsed_s"]
        steps = [row["step"] for row in metrics_rows(out)]
        return Stopped(launched, seconds, leftovers(nodes, tiny), last, spent, steps, (out / "final").exists())

    try:
        launched = launch_nodes(nodes, args, timeout=TRAIN_TIMEOUT_S, while_running=stop_mid_step)
        assert signalled_at, "no SIGTERM was sent: " + launched[0].log[-3000:]
        term = stopped(launched)
        launched = launch_nodes(nodes, [*args, "--resume", "auto"], timeout=TRAIN_TIMEOUT_S, while_running=kill_rank_2)
        assert len(signalled_at) == 2, "rank 2 was never killed: " + launched[0].log[-3000:]
        yield nodes, out, term, stopped(launched)
    finally:
        kill_leftovers(nodes, tiny)


# ------------------------------------------------------------------ launched: one run on two nodes
@pytest.mark.slow
@pytest.mark.timeout(TRAIN_TIMEOUT_S + 60)
def test_two_nodes_train_as_one_run_told_by_rank_0(uninterrupted):
    nodes, launched, out, watch, left = uninterrupted
    assert [x.returncode for x in launched] == [0, 0], launched[0].log[-3000:] + launched[1].log[-3000:]
    rows = launched_rows(launched[0].completed(), out)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # every step's metrics once
    # 5 tasks on 3 ranks (2, 2, 1), every group gathered: 5 groups of 2 episodes
    assert rows[1]["episode/tasks"] == TASKS_PER_STEP and rows[1]["train/trajectories_used"] == 2 * TASKS_PER_STEP
    assert rows[1]["train/grad_norm"] > 0
    assert "before GRPO" in launched[0].stdout
    # the checkpoint holds every rank's ZeRO-3 shards and RNG states, and its manifest lists them
    last = out / "checkpoints" / f"step-{STEPS:06d}"
    listed = set(json.loads((last / "manifest.json").read_text())["files"])
    for rank in range(sum(RANKS)):
        for name in (f"deepspeed/state/zero_pp_rank_{rank}_mp_rank_00_model_states.pt",
                     f"deepspeed/state/bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", f"rng_rank{rank}.json"):
            assert (last / name).is_file() and name in listed, name
    assert json.loads((last / "trainer_state.json").read_text())["world_size"] == sum(RANKS)
    # a periodic checkpoint holds no consolidated export; the run's end writes one (final/)
    assert not (last / "weights").exists() and not list(last.rglob("*.safetensors"))
    assert (out / "final" / "model.safetensors").is_file()
    # one narrator: node 1 prints no INFO progress and writes nothing of the run's own
    assert not re.search(r"\bINFO\b", launched[1].log), launched[1].log[-3000:]
    assert "before GRPO" not in launched[1].log
    assert sorted(p.name for p in nodes[1].cwd.iterdir()) == []
    assert (out / "report.html").is_file() and not (nodes[1].cwd / "wandb").exists()
    # the run's MCP servers ran on both nodes, and neither leaves a process or a run directory
    assert watch.servers[0] > 0 and watch.servers[1] > 0 and watch.run_dirs == list(RANKS)
    assert left == [(0, [], []), (1, [], [])]


@pytest.mark.slow
@pytest.mark.timeout(TRAIN_TIMEOUT_S + 60)
def test_the_zero3_run_trains_and_its_checkpoints_export_to_its_final_weights(uninterrupted, tiny, tmp_path, capsys):
    """Full mode under the DeepSpeed launcher (the uninterrupted launch; its exact resume is the
    interrupted run's): each checkpoint holds the shards, the model's config and tokenizer and no
    consolidated export; the run's end exports trained bf16 weights; an export on request (in
    process, no launcher) consolidates the last checkpoint's 3 ranks' shards into final/ bit for bit
    and a mid-run checkpoint's into a model of its own. (These were a one-node 2-rank launch pair of
    tests/test_deepspeed.py.)"""
    import shutil

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from skyrl_tool_agent.commands.main import main
    from skyrl_tool_agent.config import ModelConfig
    from skyrl_tool_agent.eval.policies import load_eval_policy
    from skyrl_tool_agent.policy.loading import ModelLoadError

    _, launched, full, _, _ = uninterrupted
    rows = launched_rows(launched[0].completed(), full)
    assert rows[1]["policy_tokens"] > 0 and rows[2]["train/kl"] > 0
    mid, last = (full / "checkpoints" / f"step-{n:06d}" for n in (STEPS - 1, STEPS))
    for step in (mid, last):  # the shards, the model's config and tokenizer; no consolidated export
        assert (step / "deepspeed" / "state").is_dir() and (step / "model" / "config.json").is_file()
        assert not (step / "weights").exists() and not list(step.rglob("*.safetensors")), sorted(step.rglob("*"))

    exported = AutoModelForCausalLM.from_pretrained(full / "final")
    initial = AutoModelForCausalLM.from_pretrained(tiny / "model")
    assert exported.dtype == torch.bfloat16
    assert exported.config.vocab_size == initial.config.vocab_size
    pairs = zip(exported.parameters(), initial.parameters(), strict=True)
    delta = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    assert delta > 1e-3  # trained
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.isfinite(exported(ids).logits).all()

    # An export on request (in process, no launcher): the last checkpoint's shards, consolidated,
    # are final/ bit for bit; a mid-run checkpoint's are a model of its own that loads the same way.
    for step in (mid, last):
        assert main(["export", str(step), "--output-dir", str(tmp_path / step.name)]) == 0
    last_export = load_file(str(tmp_path / last.name / "model.safetensors"))
    final = load_file(str(full / "final" / "model.safetensors"))
    assert last_export.keys() == final.keys() and all(torch.equal(last_export[k], final[k]) for k in final)
    mid_model = AutoModelForCausalLM.from_pretrained(tmp_path / mid.name)
    assert mid_model.dtype == torch.bfloat16 and torch.isfinite(mid_model(ids).logits).all()
    mid_state, initial_state = mid_model.state_dict(), initial.state_dict()
    assert any(not torch.equal(mid_state[k], exported.state_dict()[k]) for k in mid_state)  # not the last step
    assert any(not torch.equal(mid_state[k].float(), initial_state[k].float()) for k in mid_state)  # trained
    assert json.loads((tmp_path / mid.name / "exported_from.json").read_text())["step"] == STEPS - 1
    with pytest.raises(ModelLoadError, match="ZeRO-3. checkpoint holds shards, not a model: export it first"):
        load_eval_policy(str(mid), ModelConfig(device="cpu"))  # evaluate --model-path CHECKPOINT says what to do
    # an export never reads a shard that is not the bytes the run wrote, nor writes over a directory
    damaged = tmp_path / "damaged" / mid.name
    shutil.copytree(mid, damaged)
    shard = next((damaged / "deepspeed" / "state").glob("*optim_states.pt"))
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    for source, out, message in ((damaged, tmp_path / "d", "is corrupt or incomplete"),
                                 (mid, tmp_path / mid.name, "exists and is not empty")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(["export", str(source), "--output-dir", str(out)])
        err = capsys.readouterr().err.strip()
        assert exited.value.code == 2 and err.startswith("error:") and message in err and "\n" not in err, err


# ------------------------------------------------------------------ launched: one run stopped twice
@pytest.mark.slow
@pytest.mark.timeout(3 * TRAIN_TIMEOUT_S + 60)
def test_sigterm_to_both_launchers_mid_step_saves_within_their_grace(interrupted):
    """As a scheduler stops a job: SIGTERM to each node's launcher during step 1. torchrun passes it
    to its ranks and kills them after its grace (`--shutdown-timeout`, 30 s by default): every rank
    finishes step 1, saves it and exits within the grace."""
    nodes, out, term, _ = interrupted
    assert term.seconds < 30, term.seconds  # torchrun's default grace: nothing was killed after it
    log = term.launched[0].log
    assert "interrupted by SIGTERM after step 1" in log and "resume with:" in term.launched[0].stderr, log[-3000:]
    assert term.last == 1 and term.steps_logged == [0, 1] and not term.finished
    assert term.left == [(0, [], []), (1, [], [])]


@pytest.mark.slow
@pytest.mark.timeout(3 * TRAIN_TIMEOUT_S + 60)
def test_a_killed_rank_stops_every_rank_within_seconds_and_leaves_its_last_checkpoint_intact(interrupted):
    from skyrl_tool_agent.grpo.checkpoint import verify_checkpoint

    nodes, out, _, killed = interrupted
    launched = killed.launched
    # both launchers end, non-zero, well before a collective timeout would
    assert launched[0].returncode != 0 and launched[1].returncode != 0
    assert killed.seconds < STOP_TIMEOUT_S, killed.seconds
    # The survivors say which rank stopped answering: node 1's, never node 0's own (rank 1 stops
    # once rank 0 has said it and exited, or says it first).
    lines = error_lines(launched[0])
    assert lines and all(line.startswith("error: rank 2 stopped answering") for line in lines), launched[0].stderr[-4000:]
    assert killed.left == [(0, [], []), (1, [], [])]
    # The run stopped before its end, its last checkpoint intact: step 2's, or a later one where the
    # ranks finished a step between the checkpoint that triggered the kill and the kill itself.
    assert 2 <= killed.last < STEPS and not killed.finished, killed.last
    verify_checkpoint(out / "checkpoints" / f"step-{killed.last:06d}")
    # each step's metrics once over both launches so far, told by rank 0 alone
    assert killed.steps_logged in (list(range(killed.last + 1)), list(range(killed.last + 2))), killed
    assert "resumed from" in launched[0].log and "step-000001" in launched[0].log, launched[0].log[-3000:]
    assert not re.search(r"\bINFO\b", launched[1].log) and sorted(nodes[1].cwd.iterdir()) == [], launched[1].log[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(3 * TRAIN_TIMEOUT_S + 60)
def test_the_resumed_run_holds_the_uninterrupted_runs_state_at_its_last_checkpoint(interrupted, uninterrupted):
    """`--resume auto` on both nodes after the SIGTERM goes on exactly as the uninterrupted launch
    did: its steps' metrics, and at the last checkpoint before the kill the fp32 master weights and
    every rank's Adam moments (its ZeRO-3 shards), RNG states and data stream equal the
    uninterrupted run's at that step; only the time budget's clock differs, going on from the
    SIGTERM checkpoint's."""
    import torch

    _, out, term, killed = interrupted
    _, _, full, _, _ = uninterrupted
    step = f"step-{killed.last:06d}"
    a, b = full / "checkpoints" / step, out / "checkpoints" / step
    keys = ("reward/mean", "train/loss", "train/kl", "train/entropy", "train/grad_norm", "policy_tokens",
            "eval/execution_accuracy")
    rows = [metrics_rows(run)[:killed.last + 1] for run in (full, out)]
    assert [r["step"] for r in rows[1]] == list(range(killed.last + 1))
    differ = [(r["step"], k, r[k], again.get(k)) for r, again in zip(*rows, strict=True) for k in keys
              if k in r and again.get(k) != pytest.approx(r[k], rel=1e-5, abs=1e-7)]
    assert not differ, f"uninterrupted vs resumed: {differ}"
    assert all(r["time/elapsed_s"] > term.spent_s for r in rows[1][term.last + 1:])  # the clock went on

    # The fp32 master weights, consolidated (the last rank's partition pads each parameter with bytes
    # never initialised, which differ from run to run), then each rank's Adam moments and step.
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from skyrl_tool_agent.distributed.checkpoint import ENGINE_DIR, ENGINE_TAG

    masters = [get_fp32_state_dict_from_zero_checkpoint(str(ckpt / ENGINE_DIR), tag=ENGINE_TAG) for ckpt in (a, b)]
    assert masters[0] and masters[0].keys() == masters[1].keys()
    assert [k for k in masters[0] if not torch.equal(masters[0][k], masters[1][k])] == []
    for rank in range(sum(RANKS)):
        name = f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        x, y = (torch.load(ckpt / ENGINE_DIR / ENGINE_TAG / name, map_location="cpu", weights_only=False)
                ["optimizer_state_dict"]["optimizer_state_dict"]["state"] for ckpt in (a, b))
        moments = [(group, key) for group in x for key in ("exp_avg", "exp_avg_sq", "step")]
        assert moments and x.keys() == y.keys(), name
        assert [m for m in moments if not torch.equal(x[m[0]][m[1]], y[m[0]][m[1]])] == [], name
    for rank in range(sum(RANKS)):
        assert (a / f"rng_rank{rank}.json").read_text() == (b / f"rng_rank{rank}.json").read_text(), rank
    clockless = [{k: v for k, v in json.loads((ckpt / "trainer_state.json").read_text()).items() if k != "elapsed_s"}
                 for ckpt in (a, b)]  # the step and the data stream's place
    assert clockless[0] == clockless[1] and clockless[0]["step"] == killed.last


# ------------------------------------------------------------------ launched: planted faults, each stops at once
@pytest.mark.slow
@pytest.mark.timeout(STOP_TIMEOUT_S + 60)
def test_each_node_its_own_output_directory_stops_every_rank(tiny, tmp_path):
    nodes = make_nodes(tmp_path)
    launched = launch_nodes(nodes, [*cluster_args(tiny, "lora", max_steps=1), "--output-dir", "out"], timeout=STOP_TIMEOUT_S,
                            ranks=FAULT_RANKS)
    for node in launched:
        assert node.returncode != 0
        lines = error_lines(node)
        assert len(lines) == 1 and lines[0].startswith(
            "error: training.output_dir is not one directory shared by every rank: rank 1 ("), node.log[-3000:]
    assert not (nodes[0].cwd / "out" / "metrics.jsonl").exists() and not (nodes[1].cwd / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(STOP_TIMEOUT_S + 60)
def test_one_more_setting_and_another_task_file_on_one_node_stop_every_rank_before_any_work(tiny, tmp_path):
    """Node 1 sets another learning rate and reads `train.json` from its own working directory, the
    same tasks in another order: its ranks would roll out other tasks than rank 0 thinks they do.
    The task files' identity is among the settings the ranks agree on, so the launch stops before a
    model loads, with one line naming the first knob that differs and every other one (one launch
    proves both checks: without either, the line changes)."""
    nodes, out = make_nodes(tmp_path), tmp_path / "shared" / "run"
    tasks = json.loads((tiny / "train.json").read_text())
    (nodes[0].cwd / "train.json").write_text(json.dumps(tasks))
    (nodes[1].cwd / "train.json").write_text(json.dumps(tasks[::-1]))
    launched = launch_nodes(nodes, [*cluster_args(tiny, "lora", max_steps=1), "--set", "training.data.train_file=train.json",
                                    "--output-dir", str(out)], node1_args=("--set", "training.learning_rate=0.002"),
                            timeout=STOP_TIMEOUT_S, ranks=FAULT_RANKS)
    for node in launched:
        assert node.returncode != 0
        lines = error_lines(node)
        assert len(lines) == 1 and lines[0].startswith(
            "error: the ranks' settings differ: training.learning_rate is 0.001 on rank 0 ("), node.log[-3000:]
        assert "but 0.002 on rank 1 (" in lines[0] and ") (also task files): launch every node" in lines[0], lines[0]
    assert not (out / "metrics.jsonl").exists()  # stopped before any work


def test_ranks_that_drew_other_tasks_stop_with_one_line():
    """The check at every collection (`DataParallelTrainer.collect` gathers each rank's digest with
    its episodes): what the task files' identity cannot see, a pool drawn otherwise on one node."""
    from skyrl_tool_agent.config import UserInputError
    from skyrl_tool_agent.data.tasks import Task
    from skyrl_tool_agent.distributed.agreement import check_same_tasks, task_ids_digest

    tasks = [Task(task_id=f"t{i}", question="q", db_id="shop", gold_sql="SELECT 1", difficulty="easy") for i in range(3)]
    same, other = task_ids_digest(tasks), task_ids_digest(tasks[::-1])
    assert same != other and same == task_ids_digest(list(tasks))
    check_same_tasks([same, same, same], 4)  # agreeing ranks pass
    with pytest.raises(UserInputError) as raised:
        check_same_tasks([same, same, other], 4)
    message = str(raised.value)
    assert message.startswith(f"the ranks drew different tasks after step 4: rank 2's task ids digest to {other}, "
                              f"rank 0's to {same}") and "\n" not in message, message


# ------------------------------------------------------------------ no launch
def test_the_launch_agreement_imports_torch_but_not_transformers(tiny):
    """What every rank of a LoRA launch resolves before it agrees (`agreement.joined_launch`): the
    settings and the model files' identity. A refused launch stops there, so transformers (and the
    policy) must not be imported by then: each of a launch's ranks would pay ~1.5 CPU-s for it."""
    code = (
        "import sys\n"
        "from skyrl_tool_agent.config import Config\n"
        "from skyrl_tool_agent.distributed.agreement import resolved_settings\n"
        f"config = Config.model_validate({{'model': {{'name_or_path': {str(tiny / 'model')!r}}}}})\n"
        "settings = resolved_settings(config)\n"
        "assert settings['model files'] != 'null', settings['model files']\n"
        "print(sorted(m for m in ('transformers', 'peft', 'mcp') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_sweeper_leaves_a_run_directory_of_another_host_alone(tmp_path):
    """A temporary directory shared by the nodes: a live run of another node has a pid that means
    nothing here (dead here, or another process) and must not be taken for dead."""
    import socket

    from skyrl_tool_agent.mcp.reaper import OWNER_FILE, sweep_dead_runs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = time.time() - 5
    elsewhere, here = tmp_path / "run-1-aaaa", tmp_path / "run-2-bbbb"
    for run, host in ((elsewhere, "another-node"), (here, socket.gethostname())):
        run.mkdir()
        (run / OWNER_FILE).write_text(json.dumps({"host": host, "pid": gone.pid, "started": started}))
    assert sweep_dead_runs(tmp_path) == [here]
    assert elsewhere.is_dir()


def test_the_heartbeat_names_the_rank_that_stopped_beating():
    """Ranks 0-2 beat in a real TCPStore; then rank 2 stops (its process died). After a failed
    collective rank 0 names no rank while all beat and rank 2 once it stopped; on its own, rank 0's
    heartbeat names rank 2 once it has been silent `lost_after_s`; a rank that stopped because of
    rank 2 is not named with it. A beat of 0.25 s (a launch's is 2 s): the threads share this
    process's GIL with a busy machine's other work, and a live rank must never look silent for
    2.5 beats (at 0.05 s, once at half speed: 125 ms without being scheduled)."""
    from datetime import timedelta

    import torch.distributed as dist

    from skyrl_tool_agent.distributed.comm import Heartbeat

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    verdicts: list[str] = []
    beat_s = 0.25
    beats = [Heartbeat(store, rank, 3, where="here", beat_s=beat_s, lost_after_s=8 * beat_s,
                       on_lost=verdicts.append if rank == 0 else None) for rank in range(3)]
    for beat in beats:
        beat.start()
    try:
        time.sleep(2 * beat_s)
        assert beats[0].after_failure() is None and not verdicts  # all alive: this rank's own fault
        beats[2].stop()
        assert (beats[0].after_failure() or "").startswith("rank 2 stopped answering")
        deadline = time.monotonic() + 10
        while not verdicts and time.monotonic() < deadline:
            time.sleep(beat_s / 5)
        # Rank 1 stops because of rank 2 (its verdict), and its beats stop a moment later: a rank
        # whose verdict comes after that names rank 2 alone, not rank 1 with it.
        assert (beats[1].after_failure() or "").startswith("rank 2 stopped answering")
        beats[1].stop()
        time.sleep(4 * beat_s)
        assert (beats[0].stalled(2 * beat_s) or "").startswith("rank 2 stopped answering (no heartbeat"), \
            beats[0].stalled(2 * beat_s)
    finally:
        for beat in beats:
            beat.stop()
    assert verdicts and verdicts[0].startswith("rank 2 stopped answering"), verdicts


def test_a_checkpoint_the_ranks_hashed_counts_as_verified_only_as_its_manifest_records(tmp_path):
    """What the ranks hash in parallel at a resume (`distributed.checkpoint.verify_in_parallel`)
    spares rank 0 the reading only when it is what the manifest records."""
    from skyrl_tool_agent.grpo.checkpoint import MANIFEST, CheckpointError, record_verified, verify_checkpoint, write_manifest
    from skyrl_tool_agent.policy.manifest import tree_hashes

    ckpt = tmp_path / "step-000001"
    (ckpt / "deepspeed").mkdir(parents=True)
    (ckpt / "deepspeed" / "shard0.pt").write_bytes(b"a" * 10)
    (ckpt / "rng_rank0.json").write_text("{}")
    write_manifest(ckpt)
    hashes = tree_hashes(ckpt, exclude=(MANIFEST,))
    (ckpt / "deepspeed" / "shard0.pt").write_bytes(b"b" * 10)  # changed after the save, same size
    changed = tree_hashes(ckpt, exclude=(MANIFEST,))
    assert not record_verified(ckpt, changed) and not record_verified(ckpt, {**hashes, "rng_rank0.json": "0" * 64})
    with pytest.raises(CheckpointError, match="shard0.pt does not match"):
        verify_checkpoint(ckpt)
    (ckpt / "deepspeed" / "shard0.pt").write_bytes(b"a" * 10)
    assert record_verified(ckpt, hashes)
    verify_checkpoint(ckpt)
