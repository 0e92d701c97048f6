"""BPE training on a long run of one character: linear in the run's length (issue 30 #7).

Usage: python benchmarks/bpe_long_runs.py [--sizes 100000,200000,400000] [--vocab 300]

`tokenizers`' BPE trainer is quadratic in a pre-token's length, and GPT-2's pre-tokenizer makes a run of one
letter (or of spaces, or a DNA line) a single pre-token: 0.5 MB of 'a' took 97 s in prepare-data, a 250 KB
DNA line 15 s (56 s on the shared 2-core box). runner/tokenize.py cuts pre-tokens at BPE_MAX_WORD bytes
inside the tokenizer's own pipeline. This prints the training and encoding seconds per size and the ratio
of each size's training time to the first's: linear time doubles with the size, quadratic quadruples.

Measured on the shared 2-core development box (2026-11-27, whole `nanoplan prepare-data --tokenizer bpe
--vocab-size 300` processes, 3 runs after a warm-up, medians): 100 KB of 'a' 20.3 s before, 1.23 s after;
a 250 KB random ACGT line 56.2 s before, 0.63 s after; 0.5 MB of 'a' 1.49 s after.
"""

from __future__ import annotations

import argparse
import random
import time

from runner.tokenize import BpeTokenizer, split_pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,200000,400000")
    ap.add_argument("--vocab", type=int, default=300)
    args = ap.parse_args()
    rng = random.Random(0)
    first: dict[str, float] = {}
    print(f"{'input':<6} {'chars':>9} {'train s':>8} {'encode s':>9} {'train / first':>14}")
    for n in (int(x) for x in args.sizes.split(",")):
        for kind, text in (("a", "a" * n), ("ACGT", "".join(rng.choice("ACGT") for _ in range(n)))):
            t0 = time.perf_counter()
            tok = BpeTokenizer.train(split_pieces(text), args.vocab)
            t1 = time.perf_counter()
            ids = tok.encode(text)
            t2 = time.perf_counter()
            assert tok.decode(ids) == text
            first.setdefault(kind, t1 - t0)
            print(f"{kind:<6} {n:>9,} {t1 - t0:>8.2f} {t2 - t1:>9.2f} {(t1 - t0) / first[kind]:>14.1f}")


if __name__ == "__main__":
    main()
