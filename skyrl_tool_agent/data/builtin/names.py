"""Fixed word lists the row generators draw from (no Faker: the data must rebuild byte for byte).

No entry contains an apostrophe, so a value can always sit between single quotes in SQL unescaped.
"""

from __future__ import annotations

import random
from datetime import date, timedelta

FIRST_NAMES = (
    "Alice", "Bruno", "Carla", "Deepak", "Elena", "Farid", "Grace", "Hiro", "Ingrid", "Jamal",
    "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Stefan", "Tara",
    "Umar", "Vera", "Wei", "Ximena", "Yusuf", "Zoe", "Aaron", "Beatriz", "Chen", "Dmitri",
    "Emma", "Felix", "Gabriela", "Hassan", "Isla", "Jonas", "Keiko", "Liam", "Maya", "Nikolai",
    "Olivia", "Pablo", "Rania", "Samuel", "Tomas", "Uma", "Victor", "Wanda", "Yara", "Zaid",
)

LAST_NAMES = (
    "Anderson", "Baker", "Costa", "Dubois", "Evans", "Fischer", "Garcia", "Hansen", "Ito", "Jensen",
    "Kowalski", "Larsen", "McAllister", "Nakamura", "Okafor", "Petrov", "Quintero", "Rossi", "Schmidt",
    "Tanaka", "Urban", "Van Dijk", "Weber", "Xu", "Yilmaz", "Zhang", "Alvarez", "Becker", "Chopra",
    "DeLuca", "Eriksen", "Fernandez", "Gupta", "Horvat", "Ivanova", "Jovanovic", "Kim", "Lopez",
    "MacLeod", "Novak", "Olsen", "Park", "Reyes", "Silva", "Torres", "Ueda", "Vargas", "Walsh",
)

# (city, country) pairs; several cities per country so "country" filters return groups.
CITIES = (
    ("Boston", "USA"), ("Chicago", "USA"), ("Denver", "USA"), ("Seattle", "USA"),
    ("Toronto", "Canada"), ("Vancouver", "Canada"), ("Lyon", "France"), ("Paris", "France"),
    ("Berlin", "Germany"), ("Munich", "Germany"), ("Madrid", "Spain"), ("Seville", "Spain"),
    ("Rome", "Italy"), ("Milan", "Italy"), ("Tokyo", "Japan"), ("Osaka", "Japan"),
    ("Sydney", "Australia"), ("Perth", "Australia"), ("Lagos", "Nigeria"), ("Mumbai", "India"),
)

ADJECTIVES = (
    "Silent", "Golden", "Hidden", "Broken", "Crimson", "Frozen", "Lost", "Electric", "Quiet", "Wild",
    "Distant", "Burning", "Hollow", "Silver", "Midnight", "Endless", "Paper", "Iron", "Velvet", "Bright",
)

NOUNS = (
    "River", "Garden", "Empire", "Harbor", "Forest", "Mirror", "Signal", "Orchard", "Voyage", "Tower",
    "Shadow", "Island", "Machine", "Letter", "Valley", "Compass", "Lantern", "Storm", "Bridge", "Echo",
)


def person_names(rng: random.Random, count: int) -> list[str]:
    """`count` distinct 'First Last' names."""
    pool = [f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES]
    return rng.sample(pool, count)


def titles(rng: random.Random, count: int, prefix_the: float = 0.5) -> list[str]:
    """`count` distinct 'The Silent River'-style titles (mixed case, some without 'The')."""
    pool = [f"{a} {n}" for a in ADJECTIVES for n in NOUNS]
    picked = rng.sample(pool, count)
    return [f"The {t}" if rng.random() < prefix_the else t for t in picked]


def iso_date(rng: random.Random, start: str, end: str) -> str:
    """A uniformly random ISO date (YYYY-MM-DD) between `start` and `end` inclusive."""
    first, last = date.fromisoformat(start), date.fromisoformat(end)
    return (first + timedelta(days=rng.randrange((last - first).days + 1))).isoformat()


def maybe(rng: random.Random, value: object, null_rate: float) -> object:
    """`value`, or None (SQL NULL) with probability `null_rate`."""
    return None if rng.random() < null_rate else value


def skewed_choices(rng: random.Random, ids: range | list[int], k: int) -> list[int]:
    """`k` draws from `ids` where a few ids are popular (Pareto weights), like real foreign keys."""
    ids = list(ids)
    weights = [rng.paretovariate(1.5) for _ in ids]
    return rng.choices(ids, weights=weights, k=k)


def email_for(name: str, domain: str) -> str:
    """'Grace Van Dijk' -> 'grace.vandijk@<domain>'."""
    first, _, last = name.partition(" ")
    return f"{first.lower()}.{last.replace(' ', '').lower()}@{domain}"


def plural(noun: str) -> str:
    """English plural of the nouns above ('Echo' -> 'Echoes', 'Compass' -> 'Compasses')."""
    return noun + ("es" if noun.endswith(("o", "s", "sh", "ch")) else "s")
