"""`nanoplan prepare-data`: tokenizers, streaming, the val split, meta.json, estimate --data, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.datameta import DataMeta, dtype_for_vocab, load_data_meta
from planner.errors import PlanError
from runner.prepare import plan_segments, prepare_data, val_bytes
from runner.tokenize import BpeTokenizer, ByteTokenizer, CharTokenizer, load_tokenizer, safe_cut
from tests.errlines import error_and_hint

TEXT = ("Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. 🚀 naïve café, it's  done.\n"
        "\n  The quick brown fox jumps over the lazy dog 12345 times; 日本語のテキスト。\t tabs\x0bvt\n") * 7


def bins(d: Path) -> tuple[np.ndarray, np.ndarray]:
    m = load_data_meta(d)
    return np.fromfile(d / "train.bin", dtype=m.dtype), np.fromfile(d / "val.bin", dtype=m.dtype)


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `nanoplan ARGS` in-process through nanoplan.main (the exit-2 path included)."""
    from nanoplan.cli import main

    monkeypatch.setattr(sys, "argv", ["nanoplan", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> BpeTokenizer:
    return BpeTokenizer.train([TEXT[i:i + 500] for i in range(0, len(TEXT), 500)], vocab_size=400)


# ---------------------------------------------------------------- tokenizers


def test_byte_exact_counts_and_content(tmp_path) -> None:
    data = bytes(range(256)) * 40  # 10,240 bytes, not UTF-8
    (tmp_path / "a.bin").write_bytes(data)
    meta = prepare_data([str(tmp_path / "a.bin")], tmp_path / "d", "byte", val_fraction=0.01).meta
    assert (meta.train_tokens, meta.val_tokens) == (10_137, 103)  # val = ceil(102.4)
    train, val = bins(tmp_path / "d")
    assert train.dtype == np.uint16 and (tmp_path / "d" / "train.bin").stat().st_size == 2 * 10_137
    assert train.tobytes() == np.frombuffer(data[:10_137], np.uint8).astype("<u2").tobytes()
    assert val.astype(np.uint8).tobytes() == data[10_137:]


def test_byte_split_every_block(tmp_path) -> None:
    data = bytes(range(250)) * 10  # 2,500 bytes -> blocks of 1000, 1000, 500
    (tmp_path / "a").write_bytes(data)
    meta = prepare_data([str(tmp_path / "a")], tmp_path / "d", "byte", val_fraction=0.1, block_bytes=1000).meta
    assert (meta.train_tokens, meta.val_tokens) == (2250, 250)
    train, val = bins(tmp_path / "d")
    assert val.astype(np.uint8).tobytes() == data[900:1000] + data[1900:2000] + data[2450:]
    assert train.astype(np.uint8).tobytes() == data[:900] + data[1000:1900] + data[2000:2450]


def test_round_trips(bpe: BpeTokenizer) -> None:
    byte = ByteTokenizer()
    assert byte.decode(byte.encode(TEXT)) == TEXT
    raw = bytes(range(256))
    assert byte.decode_bytes(byte.encode(raw)) == raw
    char = CharTokenizer.from_alphabet(TEXT)
    assert char.vocab_size == len(set(TEXT))
    assert list(char.encode("ab")) == [char.chars.index("a"), char.chars.index("b")]
    assert char.decode(char.encode(TEXT)) == TEXT
    ids = bpe.encode(TEXT)
    assert bpe.decode(ids) == TEXT and len(ids) < len(TEXT.encode()) / 2  # merges learned
    unseen = "Ωmega ∑ ✓ — entirely new text"
    assert bpe.decode(bpe.encode(unseen)) == unseen  # byte-level: no unknown tokens
    with pytest.raises(ValueError, match="not in the char vocabulary"):
        char.encode("Ω")


def test_dtype_choice() -> None:
    assert dtype_for_vocab(256) == "uint16"
    assert dtype_for_vocab(65_536) == "uint16"  # ids 0..65535
    assert dtype_for_vocab(65_537) == "uint32"
    assert dtype_for_vocab(200_000) == "uint32"
    with pytest.raises(ValueError):
        dtype_for_vocab(0)
    with pytest.raises(ValueError, match="uint16 cannot hold"):
        DataMeta(tokenizer="bpe", vocab_size=70_000, dtype="uint16", train_tokens=1, val_tokens=0,
                 tokenizer_file="tokenizer.json")


def test_char_vocab_over_65536_writes_uint32(tmp_path) -> None:
    cps = [c for c in range(0x20, 0x20 + 70_000) if not 0xD800 <= c < 0xE000][:65_600]
    text = "".join(map(chr, cps))
    (tmp_path / "wide.txt").write_text(text, encoding="utf-8")
    meta = prepare_data([str(tmp_path / "wide.txt")], tmp_path / "d", "char", val_fraction=0.0).meta
    assert (meta.vocab_size, meta.dtype, meta.train_tokens, meta.val_tokens) == (65_600, "uint32", 65_600, 0)
    train, _ = bins(tmp_path / "d")
    assert train.dtype == np.uint32 and int(train.max()) == 65_599
    assert load_tokenizer(tmp_path / "d").decode(train) == text


# ---------------------------------------------------------------- streaming


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_tiny_chunks_equal_one_chunk(tmp_path, kind: str, bpe: BpeTokenizer) -> None:
    raw = TEXT.encode()
    tok = {"byte": ByteTokenizer(), "char": CharTokenizer.from_alphabet(TEXT), "bpe": bpe}[kind]
    whole = tok.stream()
    ref = np.concatenate([whole.feed(raw), whole.finish()])
    for size in (1, 2, 3, 5, 64):  # 1..3 split the 2-4 byte UTF-8 characters
        st = tok.stream()
        parts = [st.feed(raw[i:i + size]) for i in range(0, len(raw), size)] + [st.finish()]
        assert np.array_equal(np.concatenate(parts), ref), size
    if kind == "bpe":  # the single-call reference, without our safe cuts
        assert np.array_equal(ref, np.asarray(bpe.tok.encode(TEXT, add_special_tokens=False).ids))
    assert tok.decode(ref) == TEXT


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_prepare_output_independent_of_chunk_size(tmp_path, kind: str) -> None:
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    kw = dict(val_fraction=0.05, block_bytes=700, **({"vocab_size": 300} if kind == "bpe" else {}))
    prepare_data([str(tmp_path / "a.txt")], tmp_path / "big", kind, chunk_bytes=1 << 20, **kw)
    prepare_data([str(tmp_path / "a.txt")], tmp_path / "tiny", kind, chunk_bytes=3, **kw)
    for name in ("train.bin", "val.bin", "meta.json") + (("tokenizer.json",) if kind == "bpe" else ()):
        assert (tmp_path / "big" / name).read_bytes() == (tmp_path / "tiny" / name).read_bytes(), name
    # every segment decodes back to its exact bytes of the input
    train, val = bins(tmp_path / "big")
    tok = load_tokenizer(tmp_path / "big")
    segs = plan_segments(tmp_path / "a.txt", len(TEXT.encode()), 0.05, 700, align_utf8=True)
    raw = TEXT.encode()
    assert tok.decode(train) == b"".join(raw[s.start:s.end] for s in segs if s.split == "train").decode()
    assert tok.decode(val) == b"".join(raw[s.start:s.end] for s in segs if s.split == "val").decode()


def test_safe_cut_rule() -> None:
    assert safe_cut("ab cd") == 2
    assert safe_cut("ab  cd") == -1  # a run of spaces: the pattern splits it as ' ' + ' cd'
    assert safe_cut("ab cd ef", end=4) == 2
    assert safe_cut("ab\n cd") == -1


# ---------------------------------------------------------------- val split, meta, estimate


def test_val_split_fraction_and_utf8_alignment(tmp_path) -> None:
    assert [val_bytes(n, 0.01) for n in (0, 1, 100, 101, 4 << 20)] == [0, 1, 1, 2, 41_944]
    text = "é" * 5000  # 10,000 bytes of 2-byte characters
    (tmp_path / "e.txt").write_text(text, encoding="utf-8")
    meta = prepare_data([str(tmp_path / "e.txt")], tmp_path / "d", "char", val_fraction=0.1, block_bytes=999).meta
    # blocks of 999 bytes: tail of ceil(99.9)=100 bytes each, cut points moved to the next character start
    segs = plan_segments(tmp_path / "e.txt", 10_000, 0.1, 999, align_utf8=True)
    assert all(s.start % 2 == 0 for s in segs)
    assert meta.val_tokens == sum(s.end - s.start for s in segs if s.split == "val") // 2
    assert meta.train_tokens + meta.val_tokens == 5000
    assert meta.val_tokens / 5000 == pytest.approx(0.1, abs=0.005)


def test_meta_json_validates_and_files_match(tmp_path) -> None:
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "b.txt").write_text("second file\n", encoding="utf-8")
    res = prepare_data([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], tmp_path / "d", "bpe", vocab_size=300)
    raw = json.loads((tmp_path / "d" / "meta.json").read_text())
    meta = DataMeta.model_validate(raw)
    assert meta == res.meta == load_data_meta(tmp_path / "d")
    assert meta.tokenizer_file == "tokenizer.json" and meta.sources == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert meta.vocab_size == BpeTokenizer.from_file(tmp_path / "d" / "tokenizer.json").vocab_size == 300
    assert (tmp_path / "d" / "train.bin").stat().st_size == 2 * meta.train_tokens
    assert (tmp_path / "d" / "val.bin").stat().st_size == 2 * meta.val_tokens
    assert meta.source_bytes == len(TEXT.encode()) + 12
    assert not [p for p in (tmp_path / "d").iterdir() if p.name.startswith(".")]  # no temp files left


def test_estimate_reads_data_dir(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "prepare-data", str(tmp_path / "a.txt"), "--out",
                             str(tmp_path / "d"), "--tokenizer", "char", "--val-fraction", "0.1")
    assert code == 0, err
    meta = load_data_meta(tmp_path / "d")
    assert f"train {meta.train_tokens:,} tokens" in out
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "2xCPU", "--preset", "tiny", "--hours",
                             "0.01", "--data", str(tmp_path / "d"), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["request"]["model"]["vocab_size"] == meta.vocab_size == len(set(TEXT))
    assert plan["schedule"]["dataset_tokens"] == meta.train_tokens


def test_failed_run_keeps_previous_output(tmp_path) -> None:
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(TEXT.encode() + b"\xff tail")
    prepare_data([str(tmp_path / "a.txt")], tmp_path / "d", "char")
    before = {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()}
    with pytest.raises(PlanError, match=r"not valid UTF-8 at byte \d+"):
        prepare_data([str(tmp_path / "bad.txt")], tmp_path / "d", "bpe", vocab_size=300)
    assert {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()} == before


# ---------------------------------------------------------------- CLI errors


@pytest.mark.parametrize("case,field", [
    ("missing", "does not exist"),
    ("dir", "is a directory"),
    ("empty", "empty"),
    ("notutf8", f"not valid UTF-8 at byte {len(b'ok text ')}"),
    ("val", "--val-fraction"),
    ("val-neg", "--val-fraction"),
    ("vocab", "--vocab-size"),
    ("tok", "--tokenizer"),
])
def test_cli_bad_input_exit_2(tmp_path, monkeypatch, capsys, case: str, field: str) -> None:
    (tmp_path / "ok.txt").write_text("hello world\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "bad.txt").write_bytes(b"ok text \xc3\x28 more")
    ok = str(tmp_path / "ok.txt")
    args = {
        "missing": [str(tmp_path / "nope.txt")],
        "dir": [str(tmp_path)],
        "empty": [str(tmp_path / "empty.txt")],
        "notutf8": [str(tmp_path / "bad.txt"), "--tokenizer", "char"],
        "val": [ok, "--val-fraction", "1.5"],
        "val-neg": [ok, "--val-fraction", "-0.1"],
        "vocab": [ok, "--vocab-size", "1000"],
        "tok": [ok, "--tokenizer", "wordpiece"],
    }[case]
    code, _, err = run_cli(monkeypatch, capsys, "prepare-data", *args, "--out", str(tmp_path / "d"))
    line, _ = error_and_hint(err)
    assert code == 2 and field in line, err
    assert not (tmp_path / "d" / "meta.json").exists()


def test_subprocess_exit_2_and_no_torch(tmp_path) -> None:
    """A real process: exit code 2 on bad input, and a successful run never imports torch."""
    r = subprocess.run([sys.executable, "-m", "nanoplan", "prepare-data", str(tmp_path / "nope.txt"),
                        "--out", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    error_and_hint(r.stderr)    # one error line (and a hint line), no traceback
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    code = ("import sys; from runner.prepare import prepare_data; "
            f"prepare_data([{str(tmp_path / 'a.txt')!r}], {str(tmp_path / 'd')!r}, 'char'); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'torch']; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
