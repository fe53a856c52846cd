"""Loading the Python files a config names (`path/to/file.py:object`): reward terms
(`rewards.terms.load_term_function`), task families (`env.families.resolve_family`) and the
one-file example (`examples.one_file`).

At the bottom layer, because all three need one module per file per process. Loading a config never
calls it: the code a config names is imported when the run is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

__all__ = ["importable_from", "load_module_file", "load_module"]


@contextlib.contextmanager
def importable_from(directory: Path | None) -> Iterator[None]:
    """While inside, modules next to a user's file (`directory`) import by name, as they do when
    that file is run as a script: a family's oracle or verdict module needs no PYTHONPATH."""
    if directory is None or str(directory) in sys.path:
        yield
        return
    sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(directory))


def load_module_file(path: Path) -> ModuleType:
    """The module at `path`, loaded once per process under a name derived from its path (so two
    files with one stem do not collide). A module that fails to load is not kept."""
    name = f"skyrl_reward_terms_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with importable_from(path.parent):  # `import my_verdict` beside the file works
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_module(where: str, home: Path | None = None) -> ModuleType:
    """The module `where` names: a ``.py`` file (relative to `home`, else the working directory)
    loaded by `load_module_file`, else an importable module's name."""
    if not where.endswith(".py"):
        return importlib.import_module(where)
    return load_module_file(((home or Path.cwd()) / Path(where).expanduser()).resolve())
