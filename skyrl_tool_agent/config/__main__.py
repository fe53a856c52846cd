"""`python -m skyrl_tool_agent.config COMMAND`: inspect and regenerate the configuration.

The same as `skyrl-tool-agent config COMMAND` (and `skyrl-tool-agent knobs`).

* `show [config flags]`            validate and print the resolved config as YAML
* `write-defaults DIR [--profile cpu|gpu]`  write the four section files with their defaults
* `knobs [--markdown]`             list every knob: name, type, CPU default, H100 value, description
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skyrl_tool_agent.config.base import format_value, h100_value, has_h100
from skyrl_tool_agent.config.cli import add_config_args, config_from_args
from skyrl_tool_agent.config.errors import cli_main_guard
from skyrl_tool_agent.config.loader import CORE_SECTIONS, SECTIONS, profile_name, section_yaml


def type_name(annotation: Any) -> str:
    """A short type name: `int`, `str | None`, `lora|full` for Literals, `DifficultyMix | None`."""
    options = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(str(o) for o in options)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " | ".join(type_name(a) for a in options)
    origin = typing.get_origin(annotation)
    if origin is not None:  # list[RewardTermConfig] -> list[RewardTermConfig], dict[str, str] -> dict[str, str]
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in options)}]"
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def iter_knobs(model: BaseModel, prefix: str) -> list[tuple[str, str, str, str, str]]:
    """(dotted name, type, CPU default, H100 value or '', description) for every leaf knob of the
    default instance `model`."""
    rows = []
    for name, field in type(model).model_fields.items():
        dotted = f"{prefix}.{name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            rows.extend(iter_knobs(value, dotted))
            continue
        h100 = format_value(h100_value(field)) if has_h100(field) else ""
        text = " ".join((field.description or "").split())
        rows.append((dotted, type_name(field.annotation), format_value(value), h100, text))
    return rows


def _knobs(markdown: bool) -> None:
    rows: list[tuple[str, ...]] = []
    for section in CORE_SECTIONS:
        rows.extend(iter_knobs(SECTIONS[section][0](), section))
    if markdown:
        print("| knob | type | CPU default | H100 | description |")
        print("|---|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    else:
        for name, kind, default, h100, text in rows:
            print(f"{name} ({kind}) = {default}" + (f"  [H100: {h100}]" if h100 else "") + f"\n    {text}")


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog or "python -m skyrl_tool_agent.config",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    add_config_args(commands.add_parser("show", help="validate and print the resolved config", allow_abbrev=False))
    write = commands.add_parser("write-defaults", help="write the default section files", allow_abbrev=False)
    write.add_argument("directory", type=Path)
    write.add_argument("--profile", choices=("cpu", "gpu", "h100"), default="cpu",
                       help="cpu (the embedded tiny model) or gpu (each knob's H100 value; h100: deprecated spelling)")
    knobs = commands.add_parser("knobs", help="list every knob", allow_abbrev=False)
    knobs.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    with cli_main_guard():
        if args.command == "show":
            sys.stdout.write(config_from_args(args).dump_yaml())
        elif args.command == "write-defaults":
            profile = profile_name(args.profile)
            args.directory.mkdir(parents=True, exist_ok=True)
            for section in CORE_SECTIONS:
                schema, filename = SECTIONS[section]
                (args.directory / filename).write_text(section_yaml(section, schema(), profile), encoding="utf-8")
                print(f"wrote {args.directory / filename}")
        else:
            _knobs(args.markdown)


if __name__ == "__main__":
    main()
