"""Issue 30 #7: BPE prepare-data was quadratic in a long run of one character (0.5 MB of 'a' took 97 s; a
250 KB DNA line 15 s). The tokenizer's own pipeline now cuts pre-tokens at BPE_MAX_WORD bytes, so the
trainer's work is linear; benchmarks/bpe_long_runs.py times it (no timing here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runner.tokenize import BPE_MAX_WORD
from tests.conftest import REPO


def test_a_long_run_is_cut_in_the_saved_tokenizer_and_round_trips(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    text = "ACGT" * 2_000 + "\n" + "a" * 5_000 + " the end\n" + " " * 700 + "x\n"
    (tmp_path / "t.txt").write_text(text * 3)
    r = subprocess.run([sys.executable, "-m", "nanoplan", "prepare-data", str(tmp_path / "t.txt"), "--out",
                        str(tmp_path / "d"), "--tokenizer", "bpe", "--vocab-size", "400", "--val-fraction", "0"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.from_file(str(tmp_path / "d" / "tokenizer.json"))     # what every later reader loads
    words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str("a" * 1000 + " " + "ACGT" * 300)]
    assert max(len(w) for w in words) == BPE_MAX_WORD and "".join(words) == "a" * 1000 + "Ġ" + "ACGT" * 300
    assert max(len(t) for t in tok.get_vocab()) <= BPE_MAX_WORD
    vocab = json.loads((tmp_path / "d" / "meta.json").read_text())["vocab_size"]
    assert 256 < vocab <= 400 and tok.decode(tok.encode(text).ids) == text
    import numpy as np

    ids = np.fromfile(tmp_path / "d" / "train.bin", dtype=np.uint16)
    assert tok.decode([int(i) for i in ids]) == text * 3                  # the token file round-trips too
