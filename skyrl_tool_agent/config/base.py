"""The base class of every config section and `knob()`, the one place a knob is documented.

`knob(default, "What it is. Details.", h100=VALUE)` is a pydantic `Field` whose description ends
with "CPU default X; H100: Y." and whose H100 value is kept as metadata, so the YAML writer
(`yaml_io.render_section`) can put it in the file's comment and write an H100 profile. The first
sentence of the description is the short gloss used as the YAML comment: keep it short.
"""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

_UNSET: Any = object()


class Section(BaseModel):
    """A config section: unknown keys are errors and assignments are validated."""

    # validate_default: a bad default fails at import, and defaults get the declared type (32 -> 32.0).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


def format_value(value: Any) -> str:
    """A value as it reads in YAML (`null`, `2.0e-05`, `[a, b]`), for docs and messages."""
    value = to_jsonable_python(value)  # models, tuples, paths -> plain YAML types
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def knob(
    default: Any = _UNSET,
    description: str = "",
    *,
    h100: Any = _UNSET,
    default_factory: Any = None,
    **kwargs: Any,
) -> Any:
    """A documented field. `h100` is the value for a Qwen2.5-1.5B run on H100s when it differs
    from the CPU default (leave it out when the same value serves both)."""
    text = description.strip()
    if h100 is not _UNSET:
        shown = default if default_factory is None else default_factory()
        text = f"{text} CPU default {format_value(shown)}; H100: {format_value(h100)}."
        kwargs["json_schema_extra"] = {"h100": h100}
    if default_factory is not None:
        return Field(default_factory=default_factory, description=text, **kwargs)
    return Field(default, description=text, **kwargs)


def default_of(section: type[BaseModel], name: str) -> Any:
    """The CPU default of knob `name` of `section`, for code outside the config that needs the same
    number when no config is at hand (e.g. a SkyRL row without max_turns): referenced, never
    written again, so the two cannot drift apart."""
    field = section.model_fields[name]
    return field.get_default(call_default_factory=True)


def h100_value(field: FieldInfo) -> Any:
    """The H100 value recorded by `knob(h100=...)`; check `has_h100` first."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return extra.get("h100", _UNSET)


def has_h100(field: FieldInfo) -> bool:
    """Whether the field records an H100 value different from its CPU default."""
    return h100_value(field) is not _UNSET


# A sentence ends at ". " not preceded by an abbreviation such as "e.g" or "i.e".
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.\s")


def choices(field: FieldInfo) -> tuple[Any, ...]:
    """The allowed values of a Literal field (also inside `X | None`), else ()."""
    for arg in (field.annotation, *typing.get_args(field.annotation)):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
    return ()


def gloss(field: FieldInfo) -> str:
    """The first sentence of a field's description (the YAML comment), plus its choices."""
    text = " ".join((field.description or "").split())
    match = _SENTENCE_END.search(text)
    first = (text if match is None else text[: match.start()]).rstrip(".")
    options = choices(field)
    if options and len(options) > 1:
        first += " (" + "|".join(str(o) for o in options) + ")"
    return first


def expand_path(path: str | Path) -> Path:
    """`~` and `$VARS` expanded; relative paths stay relative to the working directory."""
    return Path(os.path.expandvars(os.path.expanduser(str(path))))
