"""Reading config files into plain mappings (errors as one-line `ConfigError`s) and writing a
section back as commented YAML (the shipped configs/*.yaml are generated this way)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from skyrl_tool_agent.config.base import format_value, gloss, h100_value, has_h100
from skyrl_tool_agent.config.errors import ConfigError

#: Column the YAML comments start at (longer lines get two spaces).
COMMENT_COLUMN = 36


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping
)


def read_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a config file (JSON for *.json, else YAML; an empty file is {}); every
    problem is a `ConfigError` naming the file as given."""
    shown = str(path)
    if not Path(path).is_file():
        raise ConfigError(f"config file not found: {shown}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read ({exc})") from exc
    try:
        data = json.loads(text) if shown.endswith(".json") else yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{shown}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{shown}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{shown}: invalid YAML: {exc}") from None
    if data is None:  # an empty file means "all defaults"
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: expected a mapping of keys to values at the top level, got {type(data).__name__}")
    return data


def _line(pad: str, body: str, comment: str) -> str:
    if not comment:
        return pad + body
    text = pad + body
    return f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}" if len(text) < COMMENT_COLUMN - 1 else f"{text}  # {comment}"


def _render_fields(model: BaseModel, indent: int, profile: str) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        comment = gloss(field)
        if has_h100(field):
            if profile == "h100":
                cpu_value = field.get_default(call_default_factory=True)
                value = h100_value(field)
                comment += f"; CPU: {format_value(cpu_value)}"
            else:
                comment += f"; H100: {format_value(h100_value(field))}"
        if isinstance(value, BaseModel):
            lines.append(_line(pad, f"{name}:", comment))
            lines.extend(_render_fields(value, indent + 2, profile))
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            lines.append(_line(pad, f"{name}:", comment))
            for item in value:
                item_lines = _render_fields(item, indent + 4, profile)
                first = item_lines[0]
                item_lines[0] = " " * (indent + 2) + "- " + first[indent + 4 :]
                lines.extend(item_lines)
        else:
            lines.append(_line(pad, f"{name}: {format_value(value)}", comment))
    return lines


def render_section(model: BaseModel, header: list[str] | None = None, profile: str = "cpu") -> str:
    """`model` as commented YAML: one line per knob, `# gloss; H100: value` (profile "cpu") or
    the H100 values with `# gloss; CPU: value` (profile "h100")."""
    if profile not in ("cpu", "h100"):
        raise ValueError(f"profile must be 'cpu' or 'h100', got {profile!r}")
    lines = [f"# {h}" if h else "#" for h in (header or [])]
    lines.extend(_render_fields(model, 0, profile))
    return "\n".join(lines) + "\n"
