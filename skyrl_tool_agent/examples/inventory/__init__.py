"""The inventory task family: warehouse questions answered with a number or a word, through the
tools of `server` (search_items, get_item, calculate), checked by `inventory_match`.

Everything a family needs, in one place: `FAMILY` (`env.task_family: inventory` names it), the
verifier term, the MCP server (`server.py`), the tasks (`tasks.json`) and the stock list
(`inventory.json`); configs/examples/inventory.yaml runs it. `agent.ScriptedInventoryAgent` is its
scripted oracle.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from skyrl_tool_agent.env.families import TaskFamily
from skyrl_tool_agent.rewards.terms import Episode

__all__ = ["FAMILY", "TASKS_FILE", "inventory_match", "normalise"]

TASKS_FILE = Path(__file__).resolve().parent / "tasks.json"
#: A numeric answer within this relative tolerance (or 0.01 absolute) of the ground truth is right.
REL_TOLERANCE = 1e-4
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)$")


def normalise(text: str) -> str:
    """Lower case, currency signs, thousands commas and surrounding punctuation dropped, spaces collapsed."""
    text = text.strip().lower().replace(",", "").replace("$", "").strip(" .!\"'")
    return " ".join(text.split())


def inventory_match(episode: Episode) -> float:
    """The family's verifier: 1 when the answer equals the ground truth, as numbers (within
    REL_TOLERANCE) when both are numbers, else as normalised text; 0 otherwise or without an answer."""
    if not episode.answered:
        return 0.0
    answer, truth = normalise(episode.answer or ""), normalise(episode.ground_truth)
    if _NUMBER.match(answer) and _NUMBER.match(truth):
        return 1.0 if math.isclose(float(answer), float(truth), rel_tol=REL_TOLERANCE, abs_tol=0.01) else 0.0
    return 1.0 if answer == truth else 0.0


FAMILY = TaskFamily(
    name="inventory",
    system_prompt=(
        "You answer questions about a warehouse's stock by calling tools. Find the items with "
        "search_items, read them with get_item, compute with calculate, then give the final answer "
        "(a number or a word) as <answer>ANSWER</answer>."
    ),
    answer_hint="ANSWER",
    verdict_term="inventory_match",
    oracle="skyrl_tool_agent.examples.inventory.agent:ScriptedInventoryAgent",
)
