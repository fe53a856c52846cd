"""The embedded default shipped in the package: its files match their recorded hashes, it loads the
way the main job loads it, it reproduces its recorded greedy check exactly, a damaged copy is
refused with one line, and the recorded build command still builds a model of the same shape.
The main job's two steps from it run in tests/test_installed.py (from the installed package)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from skyrl_tool_agent.data.frontier import FRONTIER_FILE

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, EnvConfig, ModelConfig
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.policy.loading import ModelLoadError, resolve_model_path
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE, file_sha256, tree_hashes, verify_manifest
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.eval.greedy import greedy_evaluation
from tests.fixtures.config_files import REPO

DB_ROOT = REPO / "data" / "processed" / "databases"
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings")


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((SHIPPED_EMBEDDED_DIR / MANIFEST_FILE).read_text())


def test_shipped_files_match_their_hashes(manifest) -> None:
    # nothing unlisted, nothing missing; frontier.json was measured after shipping and records the
    # weights' sha256 itself (checked at load: tests/test_frontier.py)
    assert set(manifest["files"]) == set(tree_hashes(SHIPPED_EMBEDDED_DIR, exclude=(MANIFEST_FILE, FRONTIER_FILE)))
    for name, sha in manifest["files"].items():
        assert file_sha256(SHIPPED_EMBEDDED_DIR / name) == sha, name
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    assert verify_manifest(SHIPPED_EMBEDDED_DIR)["files"] == manifest["files"]


def test_manifest_records_how_it_was_built(manifest) -> None:
    """The shipped start: the warm start (its own command under `start`) continued on the generated
    pool until its validation curve was flat (`build-model --to-plateau`), with that curve."""
    from skyrl_tool_agent.config.training import TrainingConfig
    from skyrl_tool_agent.warmstart.plateau import PlateauRule, plateau_reached

    build = "python training/scripts/build_default_model.py"
    assert manifest["command"].startswith(f"{build} --to-plateau") and manifest["start"]["command"].startswith(build)
    sft = manifest["sft"]
    assert len(sft["loss"]) == sft["planned_steps"] >= PlateauRule().min_steps
    curve = sft["evals"]
    assert curve[-1]["step"] == sft["planned_steps"]  # the held-out curve runs to the last step
    assert all(0.0 <= e["execution_accuracy"] <= 1.0 for e in curve)
    assert plateau_reached(curve, PlateauRule()) and manifest["plateau"]["stopped"].startswith("plateau:")
    # held out of the build = the validation split every run reads by default
    assert manifest["heldout_tasks"] == TrainingConfig().data.validation_tasks and manifest["shipped_dtype"] == "bfloat16"


def test_main_job_default_loads_the_shipped_model() -> None:
    config = ModelConfig()  # name_or_path embedded, embedded_dir null
    assert config.uses_shipped_model() and resolve_model_path(config) == str(SHIPPED_EMBEDDED_DIR)


def test_shipped_model_reproduces_its_greedy_check(manifest) -> None:
    check = manifest["greedy_check"]
    tasks = [Task(**t) for t in check["tasks"]]
    settings = CollectorSettings(**check["collector"])
    policy = QwenPolicy.from_config(ModelConfig(), mode="full")
    runtime = EnvRuntime(EnvConfig(), DB_ROOT)
    try:
        solved = greedy_evaluation(policy, runtime, tasks, settings).record["solved"]
    finally:
        runtime.close()
    assert solved == check["solved"]
    assert sum(solved) > 0  # a start that solves nothing would leave GRPO no signal


def test_a_damaged_copy_is_refused_with_one_line(tmp_path: Path) -> None:
    copy = tmp_path / "embedded"
    shutil.copytree(SHIPPED_EMBEDDED_DIR, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model.safetensors does not match its recorded sha256"):
        verify_manifest(copy)
    weights.unlink()
    with pytest.raises(ValueError, match=r"model.safetensors is missing"):
        verify_manifest(copy)
    (copy / MANIFEST_FILE).write_text("{")
    with pytest.raises(ValueError, match="cannot read the model manifest"):
        verify_manifest(copy)


def test_a_copy_whose_files_are_links_is_refused(tmp_path: Path) -> None:
    """Verification reads nothing through a symbolic link (it used to follow them: a weights file
    linked to /dev/zero hashed forever, one linked to any matching file passed)."""
    copy = tmp_path / "embedded"
    shutil.copytree(SHIPPED_EMBEDDED_DIR, copy)
    weights = copy / "model.safetensors"
    weights.unlink()
    weights.symlink_to(SHIPPED_EMBEDDED_DIR / "model.safetensors")  # the very same bytes
    with pytest.raises(ValueError, match=r"model.safetensors is a symbolic link: refused"):
        verify_manifest(copy)
    shutil.copy(SHIPPED_EMBEDDED_DIR / "model.safetensors", weights.with_name("weights.bin"))
    weights.unlink()
    (copy / "weights.bin").rename(weights)
    assert verify_manifest(copy)["files"]  # a regular copy again: accepted
    manifest = copy / MANIFEST_FILE
    (copy / "elsewhere.json").write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(copy / "elsewhere.json")
    with pytest.raises(ValueError, match=r"warmstart.json is a symbolic link: refused"):
        verify_manifest(copy)
    manifest.unlink()
    record = json.loads((copy / "elsewhere.json").read_text())
    record["files"]["../escape"] = record["files"].pop("config.json")
    manifest.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"'../escape' is not a file name inside"):
        verify_manifest(copy)
    linked_dir = tmp_path / "linked"  # the directory itself may be a link (a cache on another disk)
    linked_dir.symlink_to(SHIPPED_EMBEDDED_DIR)
    assert verify_manifest(linked_dir)["files"]


def test_a_damaged_shipped_model_is_a_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "embedded"
    shutil.copytree(SHIPPED_EMBEDDED_DIR, copy)
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    monkeypatch.setattr("skyrl_tool_agent.config.model.SHIPPED_EMBEDDED_DIR", copy)
    with pytest.raises(ModelLoadError, match=r"shipped embedded model is unusable: .*config.json does not match") as info:
        resolve_model_path(ModelConfig())
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_build_command_still_builds_the_same_shape(manifest, tmp_path: Path) -> None:
    """The warm start's recorded command with 2 steps instead of thousands and 1 held-out task
    instead of 256: the same tokenizer (deterministic BPE on the same oracle corpus, all of it) and
    the same architecture, which no number of steps or held-out tasks changes. Run through the
    script's `main` in this process (the script is its alias, `build_parser, main`): a launch would
    add an import of torch and transformers, and prove nothing the shapes do not."""
    import runpy

    from skyrl_tool_agent.commands.build_model import main as build_model

    script = runpy.run_path(str(REPO / "training" / "scripts" / "build_default_model.py"), run_name="alias")
    assert script["main"] is build_model  # the recorded command's script runs this very function
    # the architecture and tokenizer come from the warm start the plateau build continued
    args = shlex.split(manifest["start"]["command"])[2:]  # drop 'python training/scripts/build_default_model.py'
    for flag in ("--sft-steps", "--eval-every", "--out"):
        if flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    args = [a for a in args if a != "--force"]
    out = tmp_path / "built"
    build_model([*args, "--sft-steps", "2", "--eval-every", "1000", "--out", str(out),
                 "--set", "training.data.validation_tasks=1"])
    built = json.loads((out / "config.json").read_text())
    shipped = json.loads((SHIPPED_EMBEDDED_DIR / "config.json").read_text())
    assert {k: built.get(k) for k in SHAPE_KEYS} == {k: shipped.get(k) for k in SHAPE_KEYS}
    built_bpe = json.loads((out / "tokenizer.json").read_text())["model"]
    shipped_bpe = json.loads((SHIPPED_EMBEDDED_DIR / "tokenizer.json").read_text())["model"]
    assert built_bpe["vocab"] == shipped_bpe["vocab"] and built_bpe["merges"] == shipped_bpe["merges"]
    report = json.loads((out / MANIFEST_FILE).read_text())
    assert len(report["sft"]["loss"]) == 2 and report["heldout_tasks"] == 1
    assert [e["step"] for e in report["sft"]["evals"]] == [2]  # the held-out curve's point at the last step
    assert not list(tmp_path.glob(".built-*"))  # built in a staging directory, renamed into place

    # ... and it ships (`build-model --ship`, here into a temporary copy of the package folder):
    # bf16 files, their hashes, a greedy check made loading it as the main job loads the shipped model.
    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.jobs.build_model import ship_embedded

    dest = tmp_path / "assets" / "embedded"
    record = ship_embedded(load_config(overrides=["training.data.validation_tasks=1"]), out, dest=dest)
    assert verify_manifest(dest)["greedy_check"]["solved"] == record["greedy_check"]["solved"]
    assert len(record["greedy_check"]["solved"]) == 1 and record["shipped_dtype"] == "bfloat16"
    assert not list(dest.parent.glob(".embedded-*"))  # staged aside, renamed into place
