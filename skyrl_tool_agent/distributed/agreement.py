"""What every rank of a launch must agree on, checked rather than assumed: on one host they agree by
construction, across nodes each rank resolves its config, model files and output directory on its
own node.

* **Settings** (`agree_on_settings`): every rank's resolved config and the identity of its model
  files and task files, compared with rank 0's before any work.
* **The output directory** (`agree_on_output_dir`): one directory every rank sees (on node-local
  disks a checkpoint would be silently incomplete).
* **The task stream** (`check_same_tasks`): each collection's task ids, digested and compared (the
  ranks split a batch by position).

A disagreement stops every rank with the same one-line `UserInputError` naming the knob (or the
file) and both values.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_tool_agent.config import EMBEDDED, Config, DataConfig, ModelConfig, UserInputError
from skyrl_tool_agent.config.resume import flat_settings
from skyrl_tool_agent.data.tasks import Task

if TYPE_CHECKING:  # the annotation only: comm imports torch, which this module does not need
    from skyrl_tool_agent.distributed.comm import DistContext

#: Model files up to this size are hashed for `model_files_identity`; larger ones (the weights)
#: are compared by size, so the check costs milliseconds, not a read of 15 GB per rank.
HASHED_FILE_BYTES = 16 * 2**20
#: The keys of the model files' and the task files' identities among the resolved settings.
MODEL_FILES = "model files"
TASK_FILES = "task files"


def _file_part(file: Path) -> str:
    """What stands for one file in an identity: its sha256, or its size past `HASHED_FILE_BYTES`."""
    if not file.is_file():
        return "absent"
    size = file.stat().st_size
    return hashlib.sha256(file.read_bytes()).hexdigest() if size <= HASHED_FILE_BYTES else f"{size} bytes"


def model_files_identity(model: ModelConfig) -> str | None:
    """A digest of this node's model files (small files' sha256, large files' sizes); None for a hub
    model not in this node's cache (every node downloads one revision) or one rank 0 will build."""
    from skyrl_tool_agent.policy.loading import ModelLoadError, resolve_model_path

    try:
        name = resolve_model_path(model)
    except ModelLoadError:
        if model.name_or_path == EMBEDDED and not model.uses_shipped_model():
            return None  # not built yet: rank 0 builds it before any rank loads it
        raise
    path = Path(name).expanduser()
    if not path.is_dir():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=model.revision)
        if not isinstance(cached, str):
            return None
        path = Path(cached).parent  # the snapshot directory: its name is the revision's commit
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}={_file_part(file)}\n".encode())
    return digest.hexdigest()[:16]


def task_files_identity(data: DataConfig) -> str | None:
    """A digest of the training and dev files this node reads (`_file_part` each), or None for the
    built-in data's own files, which every node builds alike from the package. A node reading
    other task files under the same names (a relative path, a copy edited on one node) is
    refused before any model loads, not after its first collection."""
    named = [(name, path) for name, path, given in (("train", data.resolved_train_file(), data.train_file),
                                                     ("dev", data.resolved_dev_file(), data.dev_file))
             if given is not None or data.dataset != "builtin"]
    if not named:
        return None
    return hashlib.sha256("".join(f"{name}={_file_part(path)}\n" for name, path in named).encode()).hexdigest()[:16]


def resolved_settings(config: Config, deepspeed: dict[str, Any] | None = None) -> dict[str, str]:
    """Every knob as `section.key` -> its value (JSON), the DeepSpeed JSON's keys as `deepspeed.key`,
    `MODEL_FILES` -> `model_files_identity` and `TASK_FILES` -> `task_files_identity`: what the
    ranks must agree on."""
    flat = flat_settings(config.to_dict())
    if deepspeed is not None:
        flat.update(flat_settings(deepspeed, "deepspeed"))
    flat[MODEL_FILES] = json.dumps(model_files_identity(config.model))
    flat[TASK_FILES] = json.dumps(task_files_identity(config.training.data))
    return flat


def first_difference(settings: Sequence[dict[str, str]]) -> tuple[list[str], int] | None:
    """(the knobs that differ, rank) of the first rank resolving some knob otherwise than rank 0,
    or None when all agree (`model files` null differs from nothing)."""
    def differ(key: str, a: str | None, b: str | None) -> bool:
        return a != b and not (key == MODEL_FILES and "null" in (a, b))

    main = settings[0]
    for rank, mine in enumerate(settings[1:], start=1):
        keys = [*main, *(k for k in mine if k not in main)]
        differing = [k for k in keys if differ(k, main.get(k), mine.get(k))]
        if differing:
            return differing, rank
    return None


def agree_on_settings(ctx: Any, config: Config, deepspeed: dict[str, Any] | None = None) -> None:
    """Stop every rank with one line when any rank's `resolved_settings` differ from rank 0's.
    Collective (`ctx`: distributed.comm.DistContext)."""
    gathered = ctx.all_gather_object((socket.gethostname(), resolved_settings(config, deepspeed)))
    found = first_difference([settings for _, settings in gathered])
    if found is None:
        return
    (key, *others), rank = found
    (host0, main), (host, mine) = gathered[0], gathered[rank]
    named = others[:3] + ([f"{len(others) - 3} more"] if len(others) > 3 else [])
    listed = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    more = f" (also {listed})" if named else ""  # every differing knob named at once, not one launch each
    raise UserInputError(
        f"the ranks' settings differ: {key} is {main.get(key, '(unset)')} on rank 0 ({host0}) but "
        f"{mine.get(key, '(unset)')} on rank {rank} ({host}){more}: launch every node with the same command, "
        "config files, model files and task files (--profile auto resolves on each node: pin what differs with --set)")


def agree_on_output_dir(ctx: Any, out: Path) -> None:
    """Stop every rank with one line unless every rank sees the token file rank 0 writes into `out`.
    Collective."""
    token, problem = None, None
    if ctx.is_main:
        token = f".launch-check-{secrets.token_hex(8)}"
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / token).write_text(token)
        except OSError as exc:
            problem = f"cannot write into the output directory {out}: {exc.strerror or exc}"
    token, problem = ctx.broadcast_object((token, problem))
    if problem is not None:
        raise UserInputError(problem)
    seen = ctx.all_gather_object((socket.gethostname(), str(out.absolute()), (out / token).is_file()))
    if ctx.is_main:
        (out / token).unlink(missing_ok=True)
    blind = [rank for rank, (_, _, ok) in enumerate(seen) if not ok]
    if blind:
        host0, where0, _ = seen[0]
        host, where, _ = seen[blind[0]]
        ranks = f"rank{'s' if len(blind) > 1 else ''} {', '.join(map(str, blind))}"
        raise UserInputError(
            f"training.output_dir is not one directory shared by every rank: {ranks} ({host}: {where}) cannot see "
            f"the file rank 0 ({host0}) wrote into {where0}; every rank writes checkpoint shards there and resumes "
            "from it: give an absolute --output-dir on a filesystem every node mounts at the same path")


def agree_on_launch(ctx: Any, config: Config, deepspeed: dict[str, Any] | None = None) -> None:
    """The checks every rank of a launch passes before any work: the same settings, then one
    shared output directory. Collective."""
    agree_on_settings(ctx, config, deepspeed)
    agree_on_output_dir(ctx, config.training.resolved_output_dir())


def joined_launch(config: Config) -> DistContext:
    """This rank's process group on the model's device (`comm.DistContext`), its ranks agreed on the
    launch (`agree_on_launch`), with torch the only heavy import: a refused launch stops before
    the policy and the MCP client load (the two refusal tests of tests/test_multinode.py: ~2 CPU-s less each)."""
    from skyrl_tool_agent.distributed.comm import DistContext, collective_timeout
    from skyrl_tool_agent.policy.device import resolve_device

    ctx = DistContext.init(resolve_device(config.model.device), collective_timeout(config.training.collective_timeout_minutes))
    agree_on_launch(ctx, config)
    return ctx


def task_ids_digest(tasks: Sequence[Task]) -> str:
    """A short digest of the tasks' ids, in order (what every rank must draw alike)."""
    return hashlib.sha256("\n".join(t.task_id for t in tasks).encode()).hexdigest()[:16]


def check_same_tasks(digests: Sequence[str], step: int) -> None:
    """Stop every rank with one line when a rank's digest of the tasks it drew for a collection
    after `step` steps differs from rank 0's (the caller gathered `task_ids_digest` from every rank)."""
    for rank, digest in enumerate(digests):
        if digest != digests[0]:
            raise UserInputError(
                f"the ranks drew different tasks after step {step}: rank {rank}'s task ids digest to {digest}, rank 0's "
                f"to {digests[0]}: every node must read the same task files and databases "
                "(training.data.*; the generated pool is built from them) and run the same code")
