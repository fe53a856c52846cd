"""A task family in one file: shop prices looked up through one MCP tool.

    skyrl-tool-agent eval  --task-file examples/price_lookup.py --policy oracle
    skyrl-tool-agent train --task-file examples/price_lookup.py --max-steps 2 --set training.time_budget_minutes=null

The project serves TOOLS as an MCP stdio server, writes TASKS as the train and dev files, scores
each episode with `correct` (the verdict: 1 = solved) plus a small format term, and prompts with
FAMILY.system_prompt (the tool list is appended). Nothing else to write, nothing on PYTHONPATH.
"""

from skyrl_tool_agent.env.families import TaskFamily

PRICES = {"apple": 0.5, "bread": 2.25, "coffee": 7.0, "milk": 1.2}


def get_price(item: str) -> str:
    """The price of one item in euros, e.g. get_price(item="milk")."""
    if item.strip().lower() not in PRICES:
        raise ValueError(f"unknown item {item!r}; items: {', '.join(PRICES)}")
    return f"{PRICES[item.strip().lower()]:.2f}"


TOOLS = [get_price]

TASKS = [
    {"task_id": "price-0", "question": "How much does coffee cost, in euros?", "ground_truth": "7.00", "difficulty": "easy"},
    {"task_id": "price-1", "question": "How much does bread cost, in euros?", "ground_truth": "2.25", "difficulty": "easy"},
    {"task_id": "price-2", "question": "How much does milk cost, in euros?", "ground_truth": "1.20", "difficulty": "medium"},
]


def correct(episode) -> float:
    """The verdict: the answer is the price (as a number)."""
    try:
        return float(abs(float(episode.answer or "nan") - float(episode.ground_truth)) < 0.005)
    except ValueError:
        return 0.0


FAMILY = TaskFamily(
    name="prices",
    system_prompt="You answer questions about shop prices. Look the price up with get_price, then give the "
                  "number alone as <answer>PRICE</answer>.",
    verdict_term="correct",
)
