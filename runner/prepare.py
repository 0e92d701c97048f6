"""Streaming tokenisation of text files into DATA_DIR/train.bin, val.bin and meta.json (numpy only).

Inputs are read in chunks, so files larger than RAM work. The validation split is fixed by byte
positions only: each input is cut into blocks of `block_bytes` (4 MiB; the last one shorter) and
the last ceil(val_fraction * block length) bytes of every block go to val.bin, the rest to
train.bin. For char and bpe the cut points move forward to the next UTF-8 character start. Each
train or val segment is tokenised on its own, so the tokens never depend on the read chunk size.

Outputs are written under temporary names and renamed at the end; an old meta.json is removed
before the renames and the new one is written last, so a DATA_DIR with a meta.json is complete.
A temporary name carries its writer's PID and host (`.train.bin.w1234-host.XXXXXXXX.tmp`), so the
next prepare-data into the same DATA_DIR removes those of writers that are dead (killed mid-write),
on this host only, and never a link: `clean_stale_temporaries`.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from planner.datameta import DataMeta, dtype_for_vocab
from planner.errors import PlanError
from planner.plan import atomic_write_text
from planner.writes import failed
from runner.temps import clean_dead, temp_prefix
from runner.tokenize import (
    BPE_MIN_VOCAB,
    AlphabetScan,
    BpeTokenizer,
    ByteTokenizer,
    CharTokenizer,
    NotUtf8Error,
    TextCutter,
    Tokenizer,
    Utf8Stream,
    split_pieces,
)

TokenizerName = Literal["byte", "char", "bpe"]
CHUNK_BYTES = 4 << 20
BLOCK_BYTES = 4 << 20
DEFAULT_BPE_VOCAB = 8192
MAX_VAL_FRACTION = 0.5

Progress = Callable[[str, int, int], None]  # (phase, bytes done now, phase total)


@dataclass(frozen=True)
class Segment:
    """Bytes [start, end) of one input, all bound for one split."""

    path: Path
    start: int
    end: int
    split: Literal["train", "val"]


@dataclass
class PrepareResult:
    meta: DataMeta
    seconds: float
    encode_seconds: float
    files: list[Path] = field(default_factory=list)
    removed_stale: tuple[int, int] = (0, 0)     # temporaries of dead writers removed: (files, bytes)


_OUTPUTS = ("train.bin", "val.bin", "tokenizer.json")


def _temp_prefix(name: str) -> str:
    """`.NAME.wPID-HOST.`: a temporary output of this process (runner/temps.py)."""
    return temp_prefix(name)


def clean_stale_temporaries(out: Path) -> tuple[int, int]:
    """Remove the temporary outputs of earlier prepare-data runs into `out` whose writer is dead (on this
    host; a writer on another host of a shared disk is left alone), never following a link (only
    regular files are removed). Returns (files, bytes) removed."""
    return clean_dead(out, lambda name: name in _OUTPUTS)


def _umask_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _publish(tmp: Path, final: Path) -> None:
    """Give a mkstemp file (mode 0600) the usual permissions, then rename it into place."""
    os.chmod(tmp, _umask_mode())
    os.replace(tmp, final)


def val_bytes(n: int, val_fraction: float) -> int:
    """Bytes of an n-byte block that go to validation: ceil(n * f), at least 1 when f > 0."""
    return min(n, math.ceil(round(n * val_fraction, 9)))


def _utf8_start(f: BinaryIO, pos: int, size: int) -> int:
    """First position >= pos that is not a UTF-8 continuation byte (10xxxxxx)."""
    if pos >= size:
        return size
    f.seek(pos)
    for k, b in enumerate(f.read(4)):
        if b & 0xC0 != 0x80:
            return pos + k
    return min(pos + 4, size)


def plan_segments(path: Path, size: int, val_fraction: float, block_bytes: int = BLOCK_BYTES,
                  align_utf8: bool = False) -> list[Segment]:
    """The train/val segments of one input (see the module docstring)."""
    cuts: list[tuple[int, str]] = []
    for b in range(0, size, block_bytes):
        n = min(block_bytes, size - b)
        cuts.append((b, "train"))
        cuts.append((b + n - val_bytes(n, val_fraction), "val"))
    if align_utf8 and cuts:
        with open(path, "rb") as f:
            cuts = [(_utf8_start(f, pos, size), s) for pos, s in cuts]
    bounds = [pos for pos, _ in cuts] + [size]
    return [Segment(path, bounds[i], bounds[i + 1], split)  # type: ignore[arg-type]
            for i, (_, split) in enumerate(cuts) if bounds[i + 1] > bounds[i]]


def read_segment(f: BinaryIO, seg: Segment, chunk_bytes: int) -> Iterator[bytes]:
    f.seek(seg.start)
    left = seg.end - seg.start
    while left > 0:
        data = f.read(min(chunk_bytes, left))
        if not data:
            raise PlanError(str(seg.path), "file shrank while being read", "do not modify inputs during prepare-data")
        left -= len(data)
        yield data


def check_inputs(inputs: list[str]) -> list[tuple[Path, int]]:
    """Existing regular files with their sizes, or a one-line PlanError."""
    if not inputs:
        raise PlanError("INPUT", "no input files given", "pass one or more text files")
    out = []
    for s in inputs:
        p = Path(s)
        if not p.exists():
            raise PlanError(s, "file does not exist", "check the path")
        if p.is_dir():
            raise PlanError(s, "is a directory", f"pass the files inside it, e.g. {s.rstrip('/')}/*.txt")
        try:
            with open(p, "rb"):
                pass
            size = p.stat().st_size
        except OSError as e:
            raise PlanError(s, f"cannot read: {e.strerror}", "check its permissions") from None
        out.append((p, size))
    if sum(n for _, n in out) == 0:
        raise PlanError("INPUT", "the input is empty (0 bytes)", "pass non-empty text files")
    return out


class _BinWriter:
    """Appends token arrays of one dtype to a temporary file in the output directory."""

    def __init__(self, out_dir: Path, name: str, dtype: str) -> None:
        self.final = out_dir / name
        self.dtype = np.dtype(dtype).newbyteorder("<")
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(name), suffix=".tmp", dir=out_dir)
        self.tmp = Path(tmp)
        self.f = os.fdopen(fd, "wb")
        self.tokens = 0
        self.max_id = -1    # the largest token id written (checked against the vocab before publishing)

    def write(self, ids: np.ndarray) -> None:
        if ids.size:
            self.max_id = max(self.max_id, int(np.max(ids)))
            if int(np.min(ids)) < 0:
                self.max_id = max(self.max_id, 1 << 62)   # a negative id is as wrong as one past the vocab
            try:
                self.f.write(memoryview(np.ascontiguousarray(ids, dtype=self.dtype)))
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(self.final)) from None   # name the file, not the temp
            self.tokens += int(ids.size)

    def close(self) -> None:
        if not self.f.closed:
            try:
                self.f.flush()
                os.fsync(self.f.fileno())
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(self.final)) from None
            finally:
                self.f.close()

    def commit(self) -> None:
        self.close()
        _publish(self.tmp, self.final)

    def abort(self) -> None:
        try:
            self.f.close()              # a failed flush of what is left must not stop the clean-up
        except OSError:
            pass
        self.tmp.unlink(missing_ok=True)


def _text_of(segs: list[Segment], chunk_bytes: int, tick: Callable[[int], None], cut: bool) -> Iterator[str]:
    """Decoded text of segments, one segment decoded at a time; NotUtf8Error -> PlanError."""
    for path, group in _by_file(segs):
        with open(path, "rb") as f:
            for seg in group:
                dec = TextCutter(cut=cut)
                try:
                    for data in read_segment(f, seg, chunk_bytes):
                        t = dec.feed(data)
                        tick(len(data))
                        if t:
                            yield t
                    t = dec.finish()
                except NotUtf8Error as e:
                    raise _utf8_error(seg, e) from None
                if t:
                    yield t


def _utf8_error(seg: Segment, e: NotUtf8Error) -> PlanError:
    return _not_utf8(seg.path, seg.start + e.offset, e.reason)


def _not_utf8(path: Path, offset: int, reason: str) -> PlanError:
    return PlanError(str(path), f"not valid UTF-8 at byte {offset}: {reason}",
                     "use --tokenizer byte, which takes any bytes")


def _by_file(segs: list[Segment]) -> Iterator[tuple[Path, list[Segment]]]:
    i = 0
    while i < len(segs):
        j = i
        while j < len(segs) and segs[j].path == segs[i].path:
            j += 1
        yield segs[i].path, segs[i:j]
        i = j


def _scan_chars(files: list[tuple[Path, int]], chunk_bytes: int, tick: Callable[[int], None]) -> CharTokenizer:
    scan = AlphabetScan()
    for path, _ in files:
        dec = Utf8Stream()
        with open(path, "rb") as f:
            try:
                while data := f.read(chunk_bytes):
                    scan.feed(dec.feed(data))
                    tick(len(data))
                scan.feed(dec.finish())
            except NotUtf8Error as e:
                raise _not_utf8(path, e.offset, e.reason) from None
    return scan.tokenizer()


def prepare_data(inputs: list[str], out_dir: str | Path, tokenizer: str = "byte", vocab_size: int | None = None,
                 val_fraction: float = 0.01, chunk_bytes: int = CHUNK_BYTES, block_bytes: int = BLOCK_BYTES,
                 progress: Progress | None = None) -> PrepareResult:
    """Tokenise `inputs` into out_dir/{train.bin, val.bin, meta.json} (+ tokenizer.json for bpe)."""
    t0 = time.perf_counter()
    if tokenizer not in ("byte", "char", "bpe"):
        raise PlanError("--tokenizer", f"unknown tokenizer {tokenizer!r}", "use byte, char or bpe")
    if vocab_size is not None and tokenizer != "bpe":
        raise PlanError("--vocab-size", f"only applies to --tokenizer bpe ({tokenizer}'s vocab comes from the data)",
                        "drop --vocab-size or use --tokenizer bpe")
    if tokenizer == "bpe" and vocab_size is not None and not BPE_MIN_VOCAB <= vocab_size <= 2**32:
        raise PlanError("--vocab-size", f"must be between {BPE_MIN_VOCAB} and 2^32, got {vocab_size}")
    if not (isinstance(val_fraction, (int, float)) and 0 <= val_fraction <= MAX_VAL_FRACTION):
        raise PlanError("--val-fraction", f"must be between 0 and {MAX_VAL_FRACTION}, got {val_fraction}",
                        "e.g. --val-fraction 0.01")
    if chunk_bytes <= 0 or block_bytes <= 0:
        raise PlanError("chunk_bytes/block_bytes", "must be positive")
    files = check_inputs(inputs)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PlanError("--out", f"{out} exists and is not a directory", "choose a directory for DATA_DIR")
    total = sum(n for _, n in files)
    segs = [s for p, n in files for s in plan_segments(p, n, val_fraction, block_bytes, align_utf8=tokenizer != "byte")]

    def ticker(phase: str, phase_total: int) -> Callable[[int], None]:
        if progress is None:
            return lambda n: None
        progress(phase, 0, phase_total)
        return lambda n: progress(phase, n, phase_total)

    tok: Tokenizer
    if tokenizer == "byte":
        tok = ByteTokenizer()
    elif tokenizer == "char":
        tok = _scan_chars(files, chunk_bytes, ticker("scan", total))
    else:
        train_segs = [s for s in segs if s.split == "train"]
        text = _text_of(train_segs, chunk_bytes, ticker("train bpe", sum(s.end - s.start for s in train_segs)), True)
        # small pieces: the trainer buffers about a thousand items of the iterator at a time
        pieces = (p for t in text for p in split_pieces(t))
        tok = BpeTokenizer.train(pieces, vocab_size or DEFAULT_BPE_VOCAB)
    dtype = dtype_for_vocab(tok.vocab_size)
    state = {"published": False}
    try:
        return _write_data_dir(out, tok, tokenizer, dtype, segs, files, total, val_fraction, block_bytes, chunk_bytes,
                               ticker, t0, state)
    except OSError as e:                      # one line, exit 4 (planner/writes.py), never a traceback
        done = ("DATA_DIR has no meta.json now, so nothing reads it as complete; run prepare-data again"
                if state["published"] else "nothing in it was replaced")
        raise failed(Path(e.filename or out), e, "--out", done) from None


def _write_data_dir(out: Path, tok: Tokenizer, tokenizer: str, dtype: str, segs: list[Segment],
                    files: list[tuple[Path, int]], total: int, val_fraction: float, block_bytes: int,
                    chunk_bytes: int, ticker: Callable[[str, int], Callable[[int], None]], t0: float,
                    state: dict[str, bool]) -> PrepareResult:
    """Encode into temporaries in DATA_DIR, check them, then publish: meta.json last (OSError on a failed write)."""
    out.mkdir(parents=True, exist_ok=True)    # a DATA_DIR is nanoplan's own directory: made with its parents
    stale = clean_stale_temporaries(out)      # left by a prepare-data killed mid-write
    t_enc = time.perf_counter()
    writers = {s: _BinWriter(out, f"{s}.bin", dtype) for s in ("train", "val")}
    extra: list[tuple[Path, Path]] = []
    try:
        _encode(tok, segs, writers, chunk_bytes, ticker("encode", total))
        enc_s = time.perf_counter() - t_enc
        for w in writers.values():
            if w.max_id >= tok.vocab_size:
                raise PlanError(str(w.final), f"the {tokenizer} tokenizer produced token id {w.max_id:,}, outside its "
                                f"vocab of {tok.vocab_size:,} ids; nothing was written", "report this as a bug")
        if writers["train"].tokens == 0:
            raise PlanError("INPUT", f"no training tokens ({writers['val'].tokens} went to validation)",
                            "give more text or a smaller --val-fraction")
        meta = DataMeta(
            tokenizer=tokenizer, vocab_size=tok.vocab_size, dtype=dtype,  # type: ignore[arg-type]
            train_tokens=writers["train"].tokens, val_tokens=writers["val"].tokens,
            sources=[str(p) for p, _ in files], val_fraction=val_fraction, split_block_bytes=block_bytes,
            source_bytes=total,
            chars=tok.chars if isinstance(tok, CharTokenizer) else None,
            tokenizer_file="tokenizer.json" if isinstance(tok, BpeTokenizer) else None,
        )
        if isinstance(tok, BpeTokenizer):
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix("tokenizer.json"), suffix=".tmp", dir=out)
            os.close(fd)
            extra.append((Path(tmp), out / "tokenizer.json"))
            tok.save(tmp)
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        for tmp, _ in extra:
            tmp.unlink(missing_ok=True)
        raise
    state["published"] = True
    (out / "meta.json").unlink(missing_ok=True)  # a DATA_DIR without meta.json is incomplete
    for w in writers.values():
        w.commit()
    for tmp, final in extra:
        _publish(tmp, final)
    atomic_write_text(out / "meta.json", meta.model_dump_json(indent=2, exclude_none=True) + "\n")
    os.chmod(out / "meta.json", _umask_mode())
    files_out = [out / "train.bin", out / "val.bin"] + [f for _, f in extra] + [out / "meta.json"]
    return PrepareResult(meta, time.perf_counter() - t0, enc_s, files_out, stale)


def _encode(tok: Tokenizer, segs: list[Segment], writers: dict[str, _BinWriter], chunk_bytes: int,
            tick: Callable[[int], None]) -> None:
    for path, group in _by_file(segs):
        with open(path, "rb") as f:
            for seg in group:
                w = writers[seg.split]
                enc = tok.stream()
                try:
                    for data in read_segment(f, seg, chunk_bytes):
                        w.write(enc.feed(data))
                        tick(len(data))
                    w.write(enc.finish())
                except NotUtf8Error as e:
                    raise _utf8_error(seg, e) from None
