"""Writes examples/tiny/text.txt: simple generated English sentences (no copyright, no download).

    python examples/tiny/make_text.py [--kb 48] [--out examples/tiny/text.txt]

The grammar is small on purpose, so that a 131k-parameter model learns visible structure
within a minute on a laptop CPU.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

SUBJECTS = ["the old sailor", "a small fox", "my sister", "the baker", "every child", "the tired horse",
            "a quiet student", "the river", "our neighbour", "the grey cat", "a young farmer", "the captain"]
VERBS = ["walks to", "looks at", "waits for", "sings about", "runs past", "thinks of", "dreams of",
         "writes to", "sits near", "laughs at", "follows", "remembers"]
OBJECTS = ["the green hill", "a bright lamp", "the long road", "the market", "an open window", "the sea",
           "a red boat", "the winter garden", "the stone bridge", "a warm fire", "the north wind", "the library"]
TIMES = ["in the morning", "at night", "every day", "after the rain", "before dinner", "in the summer",
         "on sunday", "when the bells ring"]
ENDINGS = [".", ".", ".", "!", "?"]


def sentence(rng: random.Random) -> str:
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.6:
        s += f" {rng.choice(TIMES)}"
    s += rng.choice(ENDINGS)
    return s[0].upper() + s[1:]


def make_text(n_bytes: int, seed: int = 0) -> str:
    """About n_bytes of paragraphs, deterministic for a given seed."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        para = " ".join(sentence(rng) for _ in range(rng.randint(3, 6))) + "\n\n"
        parts.append(para)
        size += len(para)
    return "".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).with_name("text.txt")))
    a = ap.parse_args()
    Path(a.out).write_text(make_text(a.kb * 1024, a.seed), encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
