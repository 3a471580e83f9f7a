"""Sentences for the default voice's teacher data: seeded, varied, English.

Statements, questions, exclamations, lists, quotations, long clause chains, numbers of
every kind espeak reads aloud (cardinals, decimals, years, clock times, money,
percentages, ordinals, phone numbers), so the voice hears the punctuation and intonation
it will meet. ``sentences(n, seed)`` is a pure function of its arguments.
"""

from __future__ import annotations

import random

NAMES = (
    "Alice Ben Carla David Emma Felix Grace Henry Iris Jack Karen Leo Maria Noah Olivia "
    "Peter Quinn Rosa Sam Tara Umar Vera Will Xena Yusuf Zoe Anna Boris Chloe Diego "
    "Elena Frank Gina Hugo Ines James Kofi Lena Marco Nadia Oscar Priya Ravi Sofia "
    "Tomas Ursula Victor Wendy"
).split()
PLACES = (
    "the station|the old library|the harbour|the market|the north tower|the school|"
    "the village|the museum|the bakery|the river bank|the airport|the hospital|"
    "the garden|the mountain hut|the city hall|the factory|the beach|the forest|"
    "the lab|the concert hall|the stadium|the kitchen|the office|the bridge"
).split("|")
NOUNS = (
    "letter report bicycle camera window ticket puzzle engine violin recipe map lamp "
    "notebook garden computer message bottle blanket painting battery sandwich parcel "
    "umbrella ladder telescope guitar jacket kettle mirror pillow rocket tablet wallet "
    "candle compass hammer journal keyboard magnet orchard pencil radio saddle tunnel "
    "vessel whistle anchor basket cabinet diamond elephant feather glacier horizon "
    "island jungle lantern meadow needle ocean planet question river shadow thunder "
    "valley weather"
).split()
ADJECTIVES = (
    "quiet bright heavy narrow ancient careful sudden gentle strange curious "
    "golden broken silver tiny enormous quick patient clever honest nervous calm "
    "crowded empty frozen warm simple complex distant hidden lucky modern noisy "
    "polite rapid rough shiny smooth sticky tired wild"
).split()
VERBS_PAST = (
    "found opened repaired painted carried delivered borrowed described cleaned "
    "packed measured ordered returned sold visited watched wrote built checked "
    "dropped followed studied covered moved replaced tested counted noticed"
).split()
VERBS_BASE = (
    "find open repair paint carry deliver borrow describe clean pack measure order "
    "return sell visit watch write build check follow study cover move replace "
    "test count notice explain remember finish"
).split()
ADVERBS = (
    "slowly quickly carefully quietly suddenly happily easily rarely often nearly "
    "finally honestly gently loudly barely"
).split()
TIMES = (
    "yesterday|this morning|last week|on Monday|in the evening|after lunch|at dawn|"
    "before midnight|two days ago|in March|during the storm|on the weekend"
).split("|")
CONNECT = ("because|although|while|after|before|since|unless|when|even though|so that").split("|")
MONTHS = (
    "January February March April May June July August September October November December"
).split()


def _number(r: random.Random) -> str:
    kind = r.randrange(10)
    if kind == 0:
        return str(r.randrange(0, 20))
    if kind == 1:
        return str(r.randrange(20, 1000))
    if kind == 2:
        return f"{r.randrange(1000, 100000):,}"
    if kind == 3:
        return f"{r.randrange(0, 100)}.{r.randrange(0, 100):d}"
    if kind == 4:
        return f"${r.randrange(1, 500)}.{r.randrange(0, 100):02d}"
    if kind == 5:
        return f"{r.randrange(1, 100)} percent" if r.random() < 0.5 else f"{r.randrange(1, 100)}%"
    if kind == 6:
        return f"{r.randrange(1, 13)}:{r.randrange(0, 60):02d}"
    if kind == 7:
        return str(r.randrange(1900, 2040))
    if kind == 8:
        n = r.randrange(1, 32)
        suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
        return f"{n}{suffix}"
    return f"{r.randrange(200, 999)}-{r.randrange(1000, 9999)}"


def _np(r: random.Random) -> str:
    """A noun phrase."""
    det = r.choice(("the", "a", "my", "her", "his", "our", "their", "this", "that"))
    if det == "a":
        adj = r.choice(ADJECTIVES)
        det = "an" if adj[0] in "aeiou" else "a"
        return f"{det} {adj} {r.choice(NOUNS)}"
    return (
        f"{det} {r.choice(ADJECTIVES)} {r.choice(NOUNS)}"
        if r.random() < 0.6
        else f"{det} {r.choice(NOUNS)}"
    )


def _clause(r: random.Random) -> str:
    pick = r.randrange(6)
    if pick == 0:
        return f"{r.choice(NAMES)} {r.choice(VERBS_PAST)} {_np(r)} {r.choice(TIMES)}"
    if pick == 1:
        return f"{_np(r)} was {r.choice(ADJECTIVES)} near {r.choice(PLACES)}"
    if pick == 2:
        return f"we {r.choice(VERBS_PAST)} {_number(r)} {r.choice(NOUNS)}s {r.choice(ADVERBS)}"
    if pick == 3:
        return f"{r.choice(NAMES)} {r.choice(ADVERBS)} {r.choice(VERBS_PAST)} {_np(r)}"
    if pick == 4:
        return f"the price was {_number(r)} at {r.choice(PLACES)}"
    return f"{r.choice(NAMES)} and {r.choice(NAMES)} met at {r.choice(PLACES)} at {_number(r)}"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _sentence(r: random.Random) -> str:
    kind = r.randrange(12)
    if kind <= 2:
        return _cap(_clause(r)) + "."
    if kind == 3:
        return f"{_cap(_clause(r))}, {r.choice(CONNECT)} {_clause(r)}."
    if kind == 4:
        wh = r.choice(("Why", "When", "Where", "How"))
        return f"{wh} did {r.choice(NAMES)} {r.choice(VERBS_BASE)} {_np(r)}?"
    if kind == 5:
        return f"Did you {r.choice(VERBS_BASE)} {_np(r)} {r.choice(TIMES)}?"
    if kind == 6:
        return f"{_cap(r.choice(ADJECTIVES))}! {_cap(_clause(r))}!"
    if kind == 7:
        items = r.sample(NOUNS, r.randrange(3, 6))
        return f"Please bring {', '.join(items[:-1])}, and {items[-1]}."
    if kind == 8:
        return f'"{_cap(_clause(r))}," said {r.choice(NAMES)}.'
    if kind == 9:
        parts = [_clause(r) for _ in range(r.randrange(3, 5))]
        glue = [r.choice((", and", ", but", "; then", ", so", ", while")) for _ in parts[1:]]
        text = parts[0] + "".join(f"{g} {p}" for g, p in zip(glue, parts[1:], strict=True))
        return _cap(text) + "."
    if kind == 10:
        return (
            f"On {r.choice(MONTHS)} {_number(r)}, {r.choice(NAMES)} paid {_number(r)} for {_np(r)}."
        )
    return f"Is {_np(r)} really {r.choice(ADJECTIVES)}, or is it {r.choice(ADJECTIVES)}?"


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences, the same for the same (n, seed)."""
    r = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        s = _sentence(r)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
