"""Writes arithmetic_gen.jsonl: seeded, so rerunning reproduces the committed file byte for byte.

Changing this script (and so the items) requires bumping the general suite version in suite.yaml.
Run: python evaluation/suites/general/make_arithmetic.py
"""

import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemi", "Luis"]
THINGS = [("apples", "basket"), ("stickers", "album"), ("marbles", "bag"), ("books", "shelf"), ("pencils", "box"),
          ("cards", "deck"), ("shells", "bucket"), ("stamps", "folder")]
SUFFIX = " Answer with the number only."


def items(rng: random.Random) -> list[dict]:
    out = []
    for _ in range(14):
        a, b = rng.randint(12, 499), rng.randint(12, 499)
        out.append((f"What is {a} + {b}?", a + b, "addition"))
    for _ in range(12):
        a, b = rng.randint(50, 900), rng.randint(10, 49)
        out.append((f"What is {a} - {b}?", a - b, "subtraction"))
    for _ in range(12):
        a, b = rng.randint(3, 25), rng.randint(3, 19)
        out.append((f"What is {a} times {b}?", a * b, "multiplication"))
    for _ in range(10):
        b, q = rng.randint(2, 12), rng.randint(3, 30)
        out.append((f"What is {b * q} divided by {b}?", q, "division"))
    for _ in range(12):
        name = rng.choice(NAMES)
        thing, holder = rng.choice(THINGS)
        start, more, lose = rng.randint(10, 60), rng.randint(5, 40), rng.randint(1, 9)
        if lose == more:  # the answer would be `start`, which the prompt already states
            lose = lose % 9 + 1
        out.append((
            f"{name} has {start} {thing} in a {holder}, gets {more} more, then gives away {lose}. "
            f"How many {thing} does {name} have now?", start + more - lose, "word problem",
        ))
    for _ in range(10):
        name = rng.choice(NAMES)
        price, count, paid = rng.randint(2, 9), rng.randint(2, 6), 50
        out.append((
            f"{name} buys {count} notebooks at {price} euros each and pays with a {paid} euro note. "
            f"How many euros of change does {name} get?", paid - price * count, "word problem",
        ))
    return [
        {"id": f"ar-{i:03d}", "prompt": q + SUFFIX, "target": str(answer), "kind": kind}
        for i, (q, answer, kind) in enumerate(out, 1)
    ]


if __name__ == "__main__":
    path = Path(__file__).with_name("arithmetic_gen.jsonl")
    lines = "".join(json.dumps(item) + "\n" for item in items(random.Random(20260101)))
    path.write_text(lines)
    print(f"wrote {path} ({lines.count(chr(10))} items)")
