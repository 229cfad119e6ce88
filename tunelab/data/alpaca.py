"""The project's own Alpaca-format instruction data, generated from templates written for this project.

No third-party text: every record is built by :func:`generate` from the word lists and templates below, with a
seeded random generator, so the shipped file ``data/alpaca_tunelab.json`` can be rebuilt byte for byte
(``tunelab data generate``) and checked in the tests.

Records have the Alpaca keys ``instruction``, ``input`` (possibly empty) and ``output``, which is what
``litgpt.data.JSON`` reads with ``prompt_style: alpaca``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from tunelab.files import write_text_atomic

DEFAULT_SIZE = 400
"""Records in the shipped dataset: enough for a few hundred training steps of the tiny model, small in git."""
DEFAULT_SEED = 42

_NOUNS = [
    "apple",
    "river",
    "teacher",
    "bridge",
    "garden",
    "engine",
    "window",
    "forest",
    "signal",
    "market",
    "pencil",
    "harbor",
    "planet",
    "kettle",
    "ladder",
    "meadow",
    "rocket",
    "tunnel",
    "violin",
    "wallet",
    "island",
    "lantern",
]
_ADJECTIVES = [
    "quiet",
    "bright",
    "heavy",
    "narrow",
    "gentle",
    "rapid",
    "ancient",
    "modern",
    "simple",
    "careful",
    "hollow",
    "steady",
    "curious",
    "distant",
    "golden",
    "tiny",
]
_VERBS = ["build", "carry", "measure", "paint", "repair", "sort", "count", "follow", "compare", "cook", "plant"]
_NAMES = ["Ada", "Bram", "Chen", "Dara", "Emil", "Fatou", "Goran", "Hana", "Ivo", "Juno", "Kemal", "Lea"]
_UNITS = [
    ("kilometers", "meters", 1000),
    ("hours", "minutes", 60),
    ("kilograms", "grams", 1000),
    ("minutes", "seconds", 60),
    ("liters", "milliliters", 1000),
    ("days", "hours", 24),
]
_TOPICS = {
    "gradient accumulation": [
        "Split the batch you want into several micro batches that fit in memory.",
        "Run the forward and backward pass on each micro batch without stepping the optimizer.",
        "Let the gradients add up across the micro batches.",
        "Step the optimizer once, after the last micro batch, then clear the gradients.",
    ],
    "mixed precision": [
        "Keep a full precision copy of the weights for the optimizer.",
        "Run the matrix products of the forward and backward pass in a 16-bit format.",
        "Cast the gradients back to full precision before the update.",
        "Watch the loss for overflow when the 16-bit format has a small range.",
    ],
    "checkpointing": [
        "Pick the layers whose outputs you will keep.",
        "Drop the other activations after the forward pass.",
        "Recompute the dropped activations during the backward pass.",
        "Accept roughly one extra forward pass of compute in exchange for memory.",
    ],
    "making tea": [
        "Boil fresh water in a kettle.",
        "Warm the pot with a little hot water and pour it away.",
        "Add the leaves and pour the water over them.",
        "Wait three to five minutes, then pour through a strainer.",
    ],
    "planting a tree": [
        "Choose a spot with enough light and room for the roots.",
        "Dig a hole twice as wide as the root ball.",
        "Set the tree in the hole at the depth it grew before.",
        "Fill the hole with soil, press it down and water it well.",
    ],
    "reading a map": [
        "Find the legend and learn what each symbol means.",
        "Turn the map so that its north matches the real north.",
        "Locate where you are from two landmarks you can see.",
        "Trace the route and note the turns before you start walking.",
    ],
}


def _arithmetic(rng: random.Random) -> dict:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    word = {"+": "sum", "-": "difference", "*": "product"}[op]
    return {
        "instruction": f"Compute the {word} of the two numbers.",
        "input": f"{a} {op} {b}",
        "output": f"{a} {op} {b} = {value}.",
    }


def _units(rng: random.Random) -> dict:
    big, small, factor = rng.choice(_UNITS)
    n = rng.randint(2, 90)
    return {
        "instruction": f"Convert {n} {big} to {small}.",
        "input": "",
        "output": f"{n} {big} is {n * factor} {small}, because one of the first is {factor} of the second.",
    }


def _sort_words(rng: random.Random) -> dict:
    words = rng.sample(_NOUNS, rng.randint(4, 9))
    return {
        "instruction": "Sort these words in alphabetical order.",
        "input": ", ".join(words),
        "output": ", ".join(sorted(words)) + ".",
    }


def _reverse(rng: random.Random) -> dict:
    word = rng.choice(_NOUNS + _ADJECTIVES)
    return {"instruction": "Write the word backwards.", "input": word, "output": word[::-1]}


def _count_letters(rng: random.Random) -> dict:
    word = rng.choice(_NOUNS)
    letter = rng.choice(sorted(set(word)))
    n = word.count(letter)
    return {
        "instruction": f"How many times does the letter '{letter}' appear in the word?",
        "input": word,
        "output": f"The letter '{letter}' appears {n} time{'s' if n != 1 else ''} in '{word}'.",
    }


def _sentence(rng: random.Random) -> dict:
    adj, noun, verb = rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS)
    name = rng.choice(_NAMES)
    return {
        "instruction": "Write one sentence that uses all three words.",
        "input": f"{adj}, {noun}, {verb}",
        "output": f"{name} stopped to {verb} the {adj} {noun} before the sun went down.",
    }


def _word_problem(rng: random.Random) -> dict:
    name, noun = rng.choice(_NAMES), rng.choice(_NOUNS)
    boxes, per_box, given = rng.randint(2, 12), rng.randint(3, 20), rng.randint(1, 10)
    total = boxes * per_box - given
    return {
        "instruction": "Solve the word problem and explain each step.",
        "input": f"{name} has {boxes} boxes with {per_box} {noun}s in each box and gives away {given} {noun}s. "
        f"How many {noun}s are left?",
        "output": f"First find how many {noun}s there are: {boxes} boxes times {per_box} is {boxes * per_box}. "
        f"Then take away the {given} given away: {boxes * per_box} minus {given} is {total}. "
        f"{name} has {total} {noun}s left.",
    }


def _steps(rng: random.Random) -> dict:
    topic = rng.choice(sorted(_TOPICS))
    steps = _TOPICS[topic]
    intro = rng.choice(["Here is one way to do it.", "Follow these steps in order.", "The usual method is short."])
    body = " ".join(f"{i + 1}. {s}" for i, s in enumerate(steps))
    outro = rng.choice(["", " Check the result at the end.", " Repeat the last step if needed."])
    return {"instruction": f"Explain the steps of {topic}.", "input": "", "output": f"{intro} {body}{outro}"}


def _story(rng: random.Random) -> dict:
    name, other = rng.sample(_NAMES, 2)
    places = rng.sample(_NOUNS, 4)
    adj = rng.sample(_ADJECTIVES, 4)
    n_par = rng.randint(2, 6)
    parts = [f"{name} walked from the {adj[0]} {places[0]} to the {adj[1]} {places[1]}."]
    for i in range(n_par):
        p, a = rng.choice(places), rng.choice(adj)
        parts.append(
            f"On day {i + 1}, {name} and {other} decided to {rng.choice(_VERBS)} the {a} {p}, "
            f"and it took them until the evening because the {rng.choice(places)} was {rng.choice(adj)}."
        )
    parts.append(f"In the end {other} said the {adj[2]} {places[2]} was worth the trip.")
    return {
        "instruction": "Write a short story about a trip.",
        "input": f"Main character: {name}",
        "output": " ".join(parts),
    }


def _compare(rng: random.Random) -> dict:
    a, b = rng.sample(range(1, 10_000), 2)
    bigger = max(a, b)
    return {
        "instruction": "Which number is larger?",
        "input": f"{a} or {b}",
        "output": f"{bigger} is larger, by {abs(a - b)}.",
    }


_TEMPLATES: list[Callable[[random.Random], dict]] = [
    _arithmetic,
    _units,
    _sort_words,
    _reverse,
    _count_letters,
    _sentence,
    _word_problem,
    _steps,
    _story,
    _compare,
]


def generate(n: int = DEFAULT_SIZE, seed: int = DEFAULT_SEED) -> list[dict]:
    """Return ``n`` Alpaca-format records, the same for the same ``n`` and ``seed``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    return [rng.choice(_TEMPLATES)(rng) for _ in range(n)]


def write(path: Path, records: list[dict]) -> Path:
    """Write records as a JSON list (the format ``litgpt.data.JSON`` reads), atomically."""
    return write_text_atomic(Path(path), json.dumps(records, indent=1, ensure_ascii=False) + "\n")


def corpus(records: list[dict]) -> list[str]:
    """The texts a tokenizer is trained on: every field of every record, plus the Alpaca prompt words."""
    texts = [
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request. ### Instruction: ### Input: ### Response:"
    ]
    for r in records:
        texts.extend(v for v in (r["instruction"], r.get("input", ""), r["output"]) if v)
    return texts
