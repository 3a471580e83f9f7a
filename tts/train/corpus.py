"""Sentences for the default voice's teacher data: seeded, varied, English.

Statements, questions, exclamations, lists, quotations, long clause chains, numbers of
every kind espeak reads aloud (cardinals, decimals, years, clock times, money,
percentages, ordinals, phone numbers), so the voice hears the punctuation and intonation
it will meet. ``sentences(n, seed, kind)`` is a pure function of its arguments.

Two kinds: ``templates`` draws every sentence from a few hundred words (the voices
trained before the broad corpus re-draw their held-out sentences from it), ``broad``
mixes those templates with everyday sentences over a vocabulary of about 1,300 common
words (``tts.train.words``) and short replies, so a voice learns English sounds rather
than one corpus's words. No kind ever draws a quality-report probe text.
"""

from __future__ import annotations

import random

from tts.train import words as W
from tts.train.probes import PROBE_TEXTS

KINDS = ("templates", "broad")

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


def _bnp(r: random.Random) -> str:
    """A noun phrase over the broad vocabulary."""
    noun = r.choice(W.NOUNS)
    adj = r.choice(W.ADJECTIVES) if r.random() < 0.45 else ""
    head = f"{adj} {noun}" if adj else noun
    if noun in W.UNCOUNTABLE:
        return f"{r.choice(('the', 'some', 'my', 'your', 'our', 'their'))} {head}"
    det = r.choice(("the", "a", "my", "your", "his", "her", "our", "their", "this", "that"))
    return f"{W.article(head) if det == 'a' else det} {head}"


def _verb(r: random.Random) -> tuple[str, str, str, str]:
    return W.verb_forms(r.choice(W.VERBS))


def _everyday(r: random.Random, joined: bool = False) -> str:
    """A sentence over the broad vocabulary: agent phrasing, questions, statements.
    ``joined``: the second half of a compound one (no further compounds)."""
    base, third, past, part = _verb(r)
    name, np_, when = r.choice(W.NAMES), _bnp(r), r.choice(W.WHEN)
    noun, adj, place = r.choice(W.COUNTABLE), r.choice(W.ADJECTIVES), r.choice(W.PLACES)
    pick = r.randrange(19 if joined else 24)
    if pick == 0:
        return f"{name} will {base} {np_} {when}."
    if pick == 1:
        return f"{name} {past} {np_} {r.choice(W.ADVERBS)}."
    if pick == 2:
        return f"I can {base} {np_} for you."
    if pick == 3:
        return f"Let me {base} {np_} {when}."
    if pick == 4:
        return f"Would you like me to {base} {np_}?"
    if pick == 5:
        return f"Do you want to {base} {np_} {when}?"
    if pick == 6:
        return f"Your {noun} is {adj}, and it will be ready {when}."
    if pick == 7:
        return f"The {noun} has been {part} to {place}."
    if pick == 8:
        return f"I'm sorry, I couldn't {base} {np_}."
    if pick == 9:
        return f"Can you {base} {np_} at {place}?"
    if pick == 10:
        return f"There are {_number(r)} {W.plural(noun)} in {place}."
    if pick == 11:
        n, unit = r.randrange(2, 60), r.choice(W.UNITS)
        return f"It takes about {n} {unit} to get to {place}."
    if pick == 12:
        return f"Thanks for {W.ing(base)} {np_}!"
    if pick == 13:
        return f"Please don't {base} {np_} {when}."
    if pick == 14:
        return f"We're {W.ing(base)} {np_} at {place} {when}."
    if pick == 15:
        return f"{name} said that {np_} was {adj} and {r.choice(W.ADJECTIVES)}."
    if pick == 16:
        return f"How many {W.plural(noun)} did {name} {base} {when}?"
    if pick == 17:
        return f"What {adj} {noun} should we {base}?"
    if pick == 18:
        b2 = _verb(r)[0]
        return f"If you {base} {np_}, I'll {b2} {_bnp(r)}."
    if pick == 19:
        return f"{r.choice(W.INTERJECTIONS)}, {np_} is {adj}."
    if pick == 20:
        other = _everyday(r, joined=True).rstrip(".!?")
        return f"{_cap(np_)} {past} {when}, {r.choice(CONNECT)} {other[:1].lower() + other[1:]}."
    if pick == 21:
        day = r.choice(W.DAYS)
        return f"On {day}, {name} and {r.choice(W.NAMES)} {past} {np_}."
    if pick == 22:
        what = r.choice(("The meeting", "Your appointment", "The call", "The flight", "Dinner"))
        return f"{what} is at {r.randrange(1, 13)}:{r.randrange(0, 60):02d} on {r.choice(W.DAYS)}."
    items = [W.plural(x) for x in r.sample(W.COUNTABLE, r.randrange(3, 6))]
    return f"We need {', '.join(items[:-1])}, and {items[-1]}."


def _short(r: random.Random) -> str:
    """A short reply: a stock phrase, an interjection before one, or a few words."""
    pick = r.randrange(6)
    if pick <= 1:
        return r.choice(W.SHORT)
    if pick == 2:
        reply = r.choice(W.SHORT)
        return f"{r.choice(W.INTERJECTIONS)}, {reply[:1].lower() + reply[1:]}"
    if pick == 3:
        adj = _cap(r.choice(W.ADJECTIVES))
        return r.choice((f"{adj}!", f"{adj} {r.choice(W.NOUNS)}.", f"Very {adj.lower()}."))
    if pick == 4:
        noun = r.choice(W.COUNTABLE)
        return r.choice((f"The {noun}?", f"My {noun}.", f"Which {noun}?", f"Another {noun}!"))
    base, third, past, _ = _verb(r)
    return r.choice(
        (
            f"I {past} it.",
            f"{r.choice(W.NAMES)} is here.",
            f"See you {r.choice(W.WHEN)}.",
            f"Please {base}.",
            f"It {third}.",
            f"Don't {base} it!",
        )
    )


def _broad(r: random.Random) -> str:
    x = r.random()
    if x < 0.3:
        return _sentence(r)
    if x < 0.5:
        return _short(r)
    return _everyday(r)


def sentences(n: int, seed: int = 0, kind: str = "templates") -> list[str]:
    """``n`` distinct sentences of ``kind``, the same for the same (n, seed, kind)."""
    if kind not in KINDS:
        raise ValueError(f"unknown corpus kind {kind!r}; allowed: {', '.join(KINDS)}")
    draw = _sentence if kind == "templates" else _broad
    r = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set(PROBE_TEXTS)
    while len(out) < n:
        s = draw(r)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
