"""JSON from files a person (or an attacker) wrote, parsed with its nesting bounded.

Python's `json` parser recurses once per nesting level, so `[[[[...]]]]` a few thousand levels deep
raises RecursionError (a traceback, at a depth that depends on the caller's stack). The nesting is
measured first, without recursion, and a document nested deeper than `MAX_JSON_NESTING` is refused
with `JsonNestingError`, which says where: the character offset and, for a JSON list (a task file),
which element of it. Task records nest 2 levels (the list, the record), rollout records 3 (their
messages), a results.json a handful: the limit is far above every file this project writes.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

__all__ = ["MAX_JSON_NESTING", "JsonNestingError", "loads_bounded"]

#: Deepest nesting of arrays and objects accepted in a JSON document read from a file.
MAX_JSON_NESTING = 32

# A JSON string (escapes included) as one token, so brackets inside strings do not count. Possessive
# repeats: linear time on a 50 MB string. Up to the first character json rejects, this splits the
# text as json does, so json never gets deeper than the depth counted here.
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_STRINGS = re.compile(_STRING, re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]++")
_TOKENS = re.compile(_STRING + r"|[\[\]{},]", re.DOTALL)
_DEPTH_CHANGE = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonNestingError(ValueError):
    """A JSON document nested deeper than its limit. `offset`: the character that went past it;
    `element`: the index of the top-level array's element holding it (None: not inside one)."""

    def __init__(self, limit: int, offset: int, element: int | None) -> None:
        where = f"element {element}" if element is not None else f"character {offset}"
        super().__init__(f"JSON nested more than {limit} levels deep ({where})")
        self.limit = limit
        self.offset = offset
        self.element = element


def _locate(text: str, limit: int) -> tuple[int, int | None]:
    """(offset of the first bracket past `limit`, index of the top-level array element holding it)."""
    depth, element, top_is_array = 0, 0, False
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token == ",":
            element += depth == 1
        elif token[0] != '"':
            depth += _DEPTH_CHANGE[token]
            if depth == 1 and token == "[":
                top_is_array = True
            if depth > limit:
                return match.start(), element if top_is_array else None
    raise AssertionError("unreachable: called only when the nesting passes the limit")


def loads_bounded(text: str) -> Any:
    """`json.loads(text)` for a document nested at most `MAX_JSON_NESTING` deep; `JsonNestingError`
    (a ValueError) for a deeper one, `json.JSONDecodeError` for text that is not JSON. The nesting
    is the brackets outside strings, counted without recursion (about 20 ms per MB)."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    if max(accumulate(map(_DEPTH_CHANGE.__getitem__, brackets)), default=0) > MAX_JSON_NESTING:
        raise JsonNestingError(MAX_JSON_NESTING, *_locate(text, MAX_JSON_NESTING))
    return json.loads(text)
