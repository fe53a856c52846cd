"""`--set SECTION.KEY.PATH=VALUE` overrides, applied to the raw file mappings before validation,
and one-line rendering of pydantic errors naming the file or the override responsible."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from skyrl_tool_agent.config.errors import ConfigError

Loc = tuple[str | int, ...]
#: Errors listed in one message before "(and N more)".
MAX_ERRORS_SHOWN = 3
#: Error types whose message already says everything (our validators quote the values they reject).
_NO_GOT = {"missing", "extra_forbidden", "value_error", "assertion_error"}


@dataclass(frozen=True)
class Override:
    """One parsed `--set` argument: `section.path...=value` (value parsed as YAML), or a flag's typed
    value (`flag`: how errors name it, e.g. `--mcp-server`; its value a model, never text)."""

    text: str
    section: str
    path: tuple[str, ...]
    value: Any
    flag: str = "--set"

    @property
    def label(self) -> str:
        return f"{self.flag} {self.text}"


def parse_override(text: str, sections: Sequence[str]) -> Override:
    """Parse `grpo.group_size=4` (value via yaml.safe_load, so `[a, b]`, `null`, `1e-5` work)."""
    label = f"--set {text}"
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{label}: expected KEY=VALUE, e.g. grpo.group_size=4")
    section, _, rest = key.partition(".")
    if section not in sections:
        hint = difflib.get_close_matches(section, sections, n=1)
        did_you_mean = f"; did you mean '{hint[0]}'?" if hint else ""
        raise ConfigError(f"{label}: unknown section '{section}' (expected one of {', '.join(sections)}){did_you_mean}")
    path = tuple(p.strip() for p in rest.split(".")) if rest else ()
    if not path or any(not p for p in path):
        raise ConfigError(f"{label}: name a key inside the section, e.g. {section}.<key>=VALUE")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{label}: value is not valid YAML ({problem}); quote it if it is a string") from None
    return Override(text=text, section=section, path=path, value=value)


def apply_override(data: dict[str, Any], override: Override) -> Loc:
    """Set the override's value in `data` (in place), creating missing mappings on the way.
    Returns the location actually written (list indices as ints), for error attribution."""
    node: Any = data
    loc: list[str | int] = []
    for i, part in enumerate(override.path):
        last = i == len(override.path) - 1
        where = ".".join(str(p) for p in loc) or override.section
        if isinstance(node, list):
            if not part.lstrip("-").isdigit():
                raise ConfigError(f"{override.label}: '{where}' is a list; use an index, e.g. {where}.0")
            index = int(part)
            if not -len(node) <= index < len(node):
                items = f"{len(node)} item" + ("" if len(node) == 1 else "s")
                raise ConfigError(f"{override.label}: index {index} out of range ('{where}' has {items})")
            key: str | int = index
        elif isinstance(node, dict):
            key = part
        else:
            raise ConfigError(f"{override.label}: '{where}' is {type(node).__name__}, not a mapping")
        loc.append(key)
        if last:
            node[key] = override.value
        else:
            if isinstance(node, dict) and (key not in node or node[key] is None):
                node[key] = {}
            if isinstance(node[key], BaseModel):  # a flag's typed value that a later --set edits
                node[key] = node[key].model_dump()
            node = node[key]
    return tuple(loc)


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` inside `model` (for key suggestions)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return None
        current = find_model(current.model_fields[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def find_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`M`, `M | None`, `list[M]`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):  # () for an annotation that is not generic
        if (found := find_model(arg)) is not None:
            return found
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(error: dict[str, Any], model: type[BaseModel]) -> tuple[Loc, str]:
    loc: Loc = tuple(error["loc"])
    dotted = ".".join(str(p) for p in loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1) if parent else []
        return loc, f"unknown key '{dotted}'" + (f" (did you mean '{hint[0]}'?)" if hint else "")
    if kind == "missing":
        return loc, f"{dotted}: required {'item' if isinstance(loc[-1], int) else 'key'} is missing"
    msg = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = error.get("input")
    got = "" if kind in _NO_GOT or isinstance(value, (dict, BaseModel)) else f" (got {_short(value)})"
    return loc, (f"{dotted}: {msg}{got}" if dotted else f"{msg}{got}")


def _blame(loc: Loc, shown: str, overrides: Iterable[tuple[Loc, Override]]) -> str:
    """The `--set` that wrote `loc` (or a parent/child of it), else the file. A rule of a parent
    model (e.g. reward weights that must not all be 0) that several `--set` fed names them all."""
    applied = list(overrides)
    if loc:
        matching = [(w, o) for w, o in applied if loc[: min(len(loc), len(w))] == w[: min(len(loc), len(w))]]
        inside = [o for w, o in matching if len(w) > len(loc)]
        if len(inside) > 1:
            return f"{shown} (with {', '.join(o.label for o in inside)})"
        if matching:
            return matching[-1][1].label
    elif applied:
        return f"{shown} (with {', '.join(o.label for _, o in applied)})"
    return shown


def validation_message(
    exc: ValidationError, model: type[BaseModel], shown: str, overrides: Iterable[tuple[Loc, Override]] = ()
) -> str:
    """One line for a pydantic error: `<file or --set>: <field>: <problem> (got <value>)`; several
    problems are joined with '; '."""
    applied = list(overrides)
    by_source: dict[str, list[str]] = {}  # problems grouped under the file or --set they come from
    errors = exc.errors(include_url=False)
    for error in errors[:MAX_ERRORS_SHOWN]:
        loc, text = _describe(dict(error), model)
        by_source.setdefault(_blame(loc, shown, applied), []).append(text)
    message = "; ".join(f"{source}: {'; '.join(texts)}" for source, texts in by_source.items())
    extra = len(errors) - MAX_ERRORS_SHOWN
    return message + (f" (and {extra} more)" if extra > 0 else "")
