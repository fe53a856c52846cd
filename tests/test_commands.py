"""The installed command (`skyrl-tool-agent`), usable outside the repository: console script from an
empty directory, packaged default configs, `--config FILE.yaml`, no argparse abbreviations, one
output flag (`--output-dir`, alias `--output_dir`), the built-in data found or built into the cache."""

from __future__ import annotations

import ast
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from skyrl_tool_agent.commands import build_data, build_model, evaluate, memory_profile, sft_baseline, train
from skyrl_tool_agent.commands._args import new_parser
from skyrl_tool_agent.commands.main import COMMANDS
from skyrl_tool_agent.commands.main import main as cli_main
from skyrl_tool_agent.config import Config, ConfigError, add_config_args, config_from_args, load_config
from skyrl_tool_agent.config.__main__ import main as config_cli
from skyrl_tool_agent.config.loader import CORE_SECTIONS, PACKAGED_CONFIG_DIR, SECTIONS
from skyrl_tool_agent.data.builtin import location
from tests.fixtures.config_files import CONFIGS, REPO

#: The console script pip installed next to this interpreter (scripts/setup.sh: pip install -e .).
COMMAND = Path(sys.executable).parent / "skyrl-tool-agent"


def _run(args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Wall-clock timeouts are generous: a few CPU seconds each, but CI machines may be shared."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the checkout
    environ.update(TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled", **env)
    return subprocess.run(args, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------------------- the console script
@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    work = tmp_path / "elsewhere"
    work.mkdir()
    return work


def test_console_script_runs_from_an_empty_directory(empty_dir: Path, tmp_path: Path) -> None:
    if not COMMAND.is_file():
        pytest.fail(f"{COMMAND} missing: install the package (`pip install -e .`, scripts/setup.sh)")
    cache = str(tmp_path / "cache")
    done = _run([str(COMMAND), "--version"], empty_dir, SKYRL_TOOL_AGENT_CACHE=cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"skyrl-tool-agent {version('skyrl-tool-agent')}"

    done = _run([str(COMMAND), "knobs"], empty_dir, SKYRL_TOOL_AGENT_CACHE=cache)
    assert done.returncode == 0, done.stderr
    assert "grpo.group_size (int) = 8  [H100: 16]" in done.stdout
    assert "training.data.dataset (builtin|spider) = builtin" in done.stdout

    # no --config-dir: the packaged defaults load, whatever the working directory
    done = _run([str(COMMAND), "config", "show", "--set", "grpo.group_size=4"], empty_dir, SKYRL_TOOL_AGENT_CACHE=cache)
    assert done.returncode == 0, done.stderr
    shown = Config.model_validate(yaml.safe_load(done.stdout))
    assert shown == Config(grpo={"group_size": 4})

    done = _run([str(COMMAND), "train", "--config-d", "x"], empty_dir, SKYRL_TOOL_AGENT_CACHE=cache)
    assert done.returncode == 2 and "unrecognized arguments: --config-d x" in done.stderr
    assert done.stderr.startswith("usage: skyrl-tool-agent train ")
    assert list(empty_dir.iterdir()) == []  # nothing written where it was run


def test_a_command_loads_neither_torchs_compiler_nor_transformers_before_it_needs_them() -> None:
    """peft imports bitsandbytes, which wraps kernels in torch.compile at import: with TorchDynamo
    on, that loads torch's compiler stack (~0.9 CPU-s in every run and every rank). The commands
    turn it off (`commands/__init__.py`; a user's TORCHDYNAMO_DISABLE=0 is kept). And the logging
    set-up of every command turns transformers' progress bars off in a log file without importing
    transformers (~1 CPU-s an oracle or endpoint `eval` never needs): the switch still holds once a
    model load imports it."""
    code = ("import sys, skyrl_tool_agent.commands.train\n"
            "from skyrl_tool_agent.jobs.progress import setup_logging\n"
            "setup_logging()\n"
            "before = 'transformers' in sys.modules\n"
            "import peft\n"
            "from transformers.utils import logging as hf_logging\n"
            "print(before, hf_logging.is_progress_bar_enabled(), 'torch._inductor.compile_fx' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHDYNAMO_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["False", "False", "False"], (done.stdout, done.stderr[-2000:])


def test_a_command_module_run_with_python_m_says_how_to_run_it() -> None:
    """Only `commands.main` dispatches: `python -m skyrl_tool_agent.commands.train` would define the
    command and exit 0 having run nothing, so it stops with one line naming the two ways that run."""
    done = subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.train", "--mode", "lora"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr[-2000:])
    assert done.stderr.strip() == ("error: python -m skyrl_tool_agent.commands.train runs nothing by itself: run "
                                   "`skyrl-tool-agent COMMAND ...` or `python -m skyrl_tool_agent.commands.main COMMAND ...`")


def test_console_script_is_declared_and_dispatches_every_command() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"skyrl-tool-agent": "skyrl_tool_agent.commands.main:main"}
    assert "config/defaults/*" in project["tool"]["setuptools"]["package-data"]["skyrl_tool_agent"]
    assert {"train", "eval", "build-data", "build-model", "knobs", "memory-profile"} <= set(COMMANDS)
    from skyrl_tool_agent.commands.main import resolve

    for name in COMMANDS:
        assert callable(resolve(name)), name


def test_dispatcher_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["knobs", "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("| knob | type | CPU default | H100 | description |")
    with pytest.raises(SystemExit) as info:
        cli_main(["--vers"])  # no abbreviation of --version either
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli_main(["trian"])
    assert info.value.code == 2 and "invalid choice: 'trian'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main(["eval", "--help"])
    assert info.value.code == 0 and "usage: skyrl-tool-agent eval " in capsys.readouterr().out


# ---------------------------------------------------------------------------- packaged defaults
@pytest.mark.parametrize("filename", [f for _, f in SECTIONS.values()])
def test_packaged_defaults_equal_the_repository_configs(filename: str) -> None:
    assert filecmp.cmp(PACKAGED_CONFIG_DIR / filename, CONFIGS / filename, shallow=False), (
        f"skyrl_tool_agent/config/defaults/{filename} differs from configs/{filename}: regenerate both "
        "(`python -m skyrl_tool_agent.config write-defaults configs` and the same with "
        "skyrl_tool_agent/config/defaults) or copy configs/ over"
    )


def test_defaults_load_from_the_package_in_any_directory(empty_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(empty_dir)
    loaded = load_config()
    assert loaded == Config()
    assert loaded.sources.files["grpo"] == str(PACKAGED_CONFIG_DIR / "grpo_config.yaml")
    assert loaded.load_deepspeed().zero_optimization.stage == 3  # the on-demand files ship too
    args = add_config_args(new_parser(None)).parse_args([])
    assert config_from_args(args) == Config()


# ---------------------------------------------------------------------------- --config FILE.yaml
def _parse(*argv: str) -> Config:
    return config_from_args(add_config_args(new_parser(None)).parse_args(list(argv)))


def test_single_config_file(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("model:\n  lora:\n    r: 4\ngrpo:\n  group_size: 6\ntraining:\n  mode: lora\n")
    cfg = _parse("--config", str(run), "--set", "grpo.group_size=5")
    assert cfg.model.lora.r == 4 and cfg.grpo.group_size == 5  # --set wins over the file
    assert cfg.env == Config().env  # a section left out keeps its defaults
    assert cfg.sources.files["grpo"] == str(run)
    assert cfg.sources.files["deepspeed"] == str(PACKAGED_CONFIG_DIR / "deepspeed_config.json")
    # a per-section file replaces that section of the single file
    grpo = tmp_path / "g.yaml"
    grpo.write_text("group_size: 3\n")
    assert _parse("--config", str(run), "--grpo-config", str(grpo)).grpo.group_size == 3
    # a run's resolved config.yaml (Config.dump_yaml) is such a file: it reproduces the run
    original = load_config(None, ["grpo.group_size=4", "training.data.dataset=spider", "model.lora.r=2"])
    dumped = tmp_path / "config.yaml"
    dumped.write_text(original.dump_yaml())
    assert load_config(config_file=dumped) == original
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(config_file=empty) == Config()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("grpo:\n  group_size: four\n",
         "{f}: grpo: group_size: Input should be a valid integer, unable to parse string as an integer (got 'four')"),
        ("grpo:\n  group_sise: 4\n", "{f}: grpo: unknown key 'group_sise' (did you mean 'group_size'?)"),
        ("gpro:\n  group_size: 4\n",
         "{f}: unknown section 'gpro' (expected top-level keys model, training, grpo, env) (did you mean 'grpo'?)"),
        ("deepspeed: {}\n", "{f}: unknown section 'deepspeed' (expected top-level keys model, training, grpo, env); "
                            "the DeepSpeed file is given with --deepspeed-config"),
        ("grpo: [1, 2]\n", "{f}: grpo: expected a mapping of keys to values, got list"),
        ("- 1\n", "{f}: expected a mapping of keys to values at the top level, got list"),
        ("model:\n  quantization:\n    load_in_4bit: true\ntraining:\n  mode: full\n",
         "{f}: model: quantization.load_in_4bit: 4-bit loading (QLoRA) needs training.mode=lora, got full"),
    ],
)
def test_single_config_file_errors_are_one_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(config_file=path)
    assert str(info.value) == expected.format(f=path)


def test_config_and_config_dir_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parse("--config", "a.yaml", "--config-dir", str(CONFIGS))
    assert info.value.code == 2
    assert "argument --config-dir: not allowed with argument --config" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not both"):
        load_config(CONFIGS, config_file=tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match=r"^config file not found: .*missing\.yaml$"):
        load_config(config_file=tmp_path / "missing.yaml")


def test_script_alias_with_single_file_exits_2_with_one_line(tmp_path: Path) -> None:
    """The training/scripts alias takes --config too, and a bad file is one `error:` line."""
    path = tmp_path / "run.yaml"
    path.write_text("grpo:\n  group_size: four\n")
    done = _run([sys.executable, str(REPO / "training" / "scripts" / "train_grpo.py"), "--config", str(path)], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {path}: grpo: group_size: Input should be a valid integer, unable to parse string as an integer "
        "(got 'four')"
    )
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------- no abbreviations
def _parser_calls(path: Path) -> list[ast.Call]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("ArgumentParser", "add_parser"):
            calls.append(node)
    return calls


def test_every_parser_disallows_abbreviations() -> None:
    # mcp_tools/sqlite_server.py is not a user command (the pool spawns it with fixed flags).
    files = [*(REPO / "skyrl_tool_agent").rglob("*.py"), *(REPO / "training").rglob("*.py"),
             *(REPO / "benchmarks").glob("*.py")]
    checked = 0
    for path in files:
        for call in _parser_calls(path):
            keywords = {k.arg: k.value for k in call.keywords}
            value = keywords.get("allow_abbrev")
            assert isinstance(value, ast.Constant) and value.value is False, f"{path}:{call.lineno}"
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize(
    ("parse", "argv"),
    [
        (train.parse_args, ["--config-d", "x"]),
        (train.parse_args, ["--max-step", "3"]),
        (evaluate.parse_args, ["--config-d", "x"]),
        (evaluate.parse_args, ["--num-sample", "2"]),
        (sft_baseline.parse_args, ["--minutes", "1", "--config-d", "x"]),
        (memory_profile.parse_args, ["--json", "x.json"]),
        (lambda argv: build_data.build_parser().parse_args(argv), ["--outp", "x"]),
        (lambda argv: build_model.build_parser().parse_args(argv), ["--sft", "2"]),
        (lambda argv: config_cli(argv), ["show", "--config-d", "x"]),
    ],
)
def test_abbreviations_are_errors(parse, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


# ---------------------------------------------------------------------------- --output-dir / --output_dir
@pytest.mark.parametrize("flag", ["--output-dir", "--output_dir"])
def test_output_dir_flag_and_hf_alias(flag: str, tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    assert train.parse_args([flag, out]).output_dir == out
    assert evaluate.parse_args([flag, out]).results == Path(out) / "results.json"
    assert sft_baseline.parse_args(["--minutes", "1", flag, out]).result == Path(out) / "sft_baseline.json"
    assert memory_profile.parse_args([flag, out]).results == Path(out) / "memory_profile.json"
    assert build_data.build_parser().parse_args([flag, out]).output_dir == out
    assert build_model.build_parser().parse_args([flag, out]).output_dir == out


def test_output_files_keep_their_old_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate.parse_args([]).results == Path("results.json")
    assert evaluate.parse_args(["--output", "a/b.json"]).results == Path("a/b.json")
    assert sft_baseline.parse_args(["--minutes", "1"]).result == Path("sft_baseline.json")
    assert memory_profile.parse_args([]).results == Path("outputs/memory_profile.json")
    assert memory_profile.parse_args(["--json-out", "m.json"]).results == Path("m.json")
    assert build_model.build_parser().parse_args(["--out", "d"]).output_dir == "d"  # recorded build commands
    assert build_data.build_parser().parse_args(["--out", "d"]).output_dir == "d"
    assert build_data.build_parser().parse_args([]).output_dir is None
    with pytest.raises(SystemExit) as info:
        evaluate.parse_args(["--output", "r.json", "--output-dir", "d"])
    assert info.value.code == 2 and "give one" in capsys.readouterr().err


# ---------------------------------------------------------------------------- built-in data location
def test_builtin_data_does_not_depend_on_the_working_directory(empty_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(empty_dir)
    data = load_config().training.data
    assert data.resolved_db_root() == REPO / "data" / "processed" / "databases"  # the checkout's
    assert data.resolved_train_file().is_file() and data.resolved_dev_file().is_file()
    assert location.default_output_dir() == REPO / "data" / "processed"
    # paths the user gives stay relative to the working directory, as documented
    assert load_config(None, ["training.data.db_root=dbs"]).training.data.resolved_db_root() == Path("dbs")


def test_outside_a_checkout_the_builtin_data_is_built_into_the_cache(tmp_path: Path) -> None:
    """The package copied out of the checkout (as a wheel install has it): the config names the cache
    entry, and the first load of the tasks builds the built-in data there, byte-identical to data/processed."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "skyrl_tool_agent", site / "skyrl_tool_agent",
                    ignore=shutil.ignore_patterns("__pycache__", "assets"))
    work = tmp_path / "work"
    work.mkdir()
    cache = tmp_path / "cache"
    script = (
        "import skyrl_tool_agent, json\n"
        "from skyrl_tool_agent.config import load_config\n"
        "from skyrl_tool_agent.data.builtin import location\n"
        "from skyrl_tool_agent.eval.splits import TaskSplits\n"
        "cfg = load_config()\n"
        "TaskSplits.load(cfg)\n"
        "print(json.dumps({'package': skyrl_tool_agent.__file__, 'db_root': str(cfg.training.data.resolved_db_root()),\n"
        "                  'train': str(cfg.training.data.resolved_train_file()),\n"
        "                  'defaults': cfg.sources.files['model'], 'out': str(location.default_output_dir())}))\n"
    )
    done = _run([sys.executable, "-c", script], work, timeout=280, PYTHONPATH=str(site),
                SKYRL_TOOL_AGENT_CACHE=str(cache))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["package"].startswith(str(site))
    assert seen["defaults"].startswith(str(site / "skyrl_tool_agent" / "config" / "defaults"))
    built = Path(seen["db_root"]).parent
    assert built.parent == cache / "builtin" and built.name.startswith("seed0-")
    assert Path(seen["train"]) == built / "train.json" and Path(seen["out"]) == built
    for name in ("train.json", "dev.json"):
        assert (built / name).read_bytes() == (REPO / "data" / "processed" / name).read_bytes()
    assert sorted(p.name for p in (built / "databases").iterdir()) == \
        sorted(p.name for p in (REPO / "data" / "processed" / "databases").iterdir())
    assert not list(built.parent.glob(".building-*"))  # staged, then renamed into place
    assert list(work.iterdir()) == []


def test_declared_dependencies_are_imported() -> None:
    """tqdm is used by nothing here (gone); omegaconf and numpy are imported (declared)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("<")[0].split("=")[0].strip().lower() for d in deps}
    assert {"omegaconf", "numpy", "mcp-types", "safetensors"} <= names
    assert not {"tqdm", "accelerate"} & names
    assert all(">=" in d for d in deps)
    capped = {d.split(">=")[0]: d for d in deps}
    for name in ("transformers", "peft", "mcp", "wandb", "weave"):
        assert ",<" in capped[name], capped[name]
    assert (REPO / "constraints.txt").is_file()
    assert "-c constraints.txt" in (REPO / "scripts" / "setup.sh").read_text()
    assert set(CORE_SECTIONS) <= set(SECTIONS)
