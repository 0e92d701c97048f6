"""Tokenizers for `nanoplan prepare-data`: byte, char and ByteLevel BPE (numpy only; no torch).

Each tokenizer has `name`, `vocab_size`, `encode(text) -> np.ndarray`, `decode(ids) -> str` and
`stream()`, a streaming encoder fed raw file bytes in chunks of any size: the tokens it returns
do not depend on where the chunks are cut (a UTF-8 character or a word may straddle two chunks).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

BPE_MIN_VOCAB = 257          # the 256 byte symbols plus at least one merge
BPE_PIECE_CHARS = 1 << 16    # text piece size handed to encode_batch (parallel in Rust)
# The longest pre-token BPE sees (bytes): `tokenizers`' BPE trainer is quadratic in a word's length, and a
# run of one character is one GPT-2 pre-token (0.5 MB of 'a' took 97 s, a 250 KB DNA line 15 s: issue 30
# #7). Longer runs are cut into pieces of this many bytes, in the tokenizer's own pipeline (tokenizer.json),
# so training, encoding and every later reader cut alike; no real vocabulary has a longer token.
BPE_MAX_WORD = 256
MAX_CARRY_CHARS = 1 << 24    # give up waiting for a safe cut after this many characters


class NotUtf8Error(ValueError):
    """The input is not valid UTF-8; `offset` is the byte offset of the first bad byte."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"not valid UTF-8 at byte {offset}: {reason}")


class StreamEncoder(Protocol):
    def feed(self, data: bytes) -> np.ndarray: ...
    def finish(self) -> np.ndarray: ...


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...
    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...
    def stream(self) -> StreamEncoder: ...


_EMPTY = np.zeros(0, dtype=np.uint32)
_MISSING = np.uint32(0xFFFFFFFF)


# ---------------------------------------------------------------- UTF-8 streaming

class Utf8Stream:
    """Incremental UTF-8 decoder that reports absolute byte offsets of errors."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")("strict")
        self._consumed = 0  # bytes fed before the current call

    def feed(self, data: bytes, final: bool = False) -> str:
        pending = len(self._dec.getstate()[0])
        try:
            text = self._dec.decode(data, final)
        except UnicodeDecodeError as e:
            raise NotUtf8Error(self._consumed - pending + e.start, e.reason) from None
        self._consumed += len(data)
        return text

    def finish(self) -> str:
        return self.feed(b"", final=True)


def safe_cut(text: str, end: int | None = None, start: int = 0) -> int:
    """Largest i in (start, end) where ByteLevel pre-tokenisation of text[:i] and text[i:] equals
    that of the whole text, or -1. Uses a space with a non-space on both sides: under the GPT-2
    pattern no pre-token crosses it, the one before ends there and the one after starts there."""
    end = len(text) - 2 if end is None else min(end, len(text) - 2)
    i = text.rfind(" ", start + 1, end + 1)
    while i > start:
        if not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", start + 1, i)
    return -1


class TextCutter:
    """Bytes in, text out, cut only where `safe_cut` allows (or anywhere when cut=False)."""

    def __init__(self, cut: bool) -> None:
        self._utf8 = Utf8Stream()
        self._cut = cut
        self._carry = ""

    def feed(self, data: bytes) -> str:
        text = self._carry + self._utf8.feed(data)
        if not self._cut:
            return text
        i = safe_cut(text)
        if i < 0 and len(text) < MAX_CARRY_CHARS:
            self._carry = text
            return ""
        i = len(text) if i < 0 else i
        self._carry = text[i:]
        return text[:i]

    def finish(self) -> str:
        text = self._carry + self._utf8.finish()
        self._carry = ""
        return text


# ---------------------------------------------------------------- byte

class _ByteStream:
    def feed(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8)

    def finish(self) -> np.ndarray:
        return _EMPTY


class ByteTokenizer:
    """One token per byte (ids 0..255): lossless for any input, UTF-8 or not."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else text
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

    def decode_bytes(self, ids: Sequence[int] | np.ndarray) -> bytes:
        return np.asarray(ids, dtype=np.uint8).tobytes()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream(self) -> StreamEncoder:
        return _ByteStream()


# ---------------------------------------------------------------- char

def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


class _CharStream:
    def __init__(self, tok: CharTokenizer) -> None:
        self._tok = tok
        self._utf8 = Utf8Stream()

    def feed(self, data: bytes) -> np.ndarray:
        return self._tok.encode(self._utf8.feed(data))

    def finish(self) -> np.ndarray:
        return self._tok.encode(self._utf8.finish())


class CharTokenizer:
    """One token per Unicode character; token id = index in `chars`."""

    name = "char"

    def __init__(self, chars: str) -> None:
        if not chars:
            raise ValueError("the char alphabet is empty")
        if len(set(chars)) != len(chars):
            raise ValueError("the char alphabet has repeated characters")
        self.chars = chars
        self.vocab_size = len(chars)
        self._cps = _codepoints(chars)
        self._lut = np.full(int(self._cps.max()) + 2, _MISSING, dtype=np.uint32)  # code point -> id
        self._lut[self._cps] = np.arange(len(chars), dtype=np.uint32)

    @classmethod
    def from_alphabet(cls, alphabet: Iterable[str]) -> CharTokenizer:
        """Ids in code-point order, so the same text always gives the same ids."""
        return cls("".join(sorted(set(alphabet))))

    def encode(self, text: str) -> np.ndarray:
        if not text:
            return _EMPTY
        cps = _codepoints(text)
        ids = self._lut[np.minimum(cps, len(self._lut) - 1)]  # the last slot is always missing
        bad = ids == _MISSING
        if bad.any():
            ch = chr(int(cps[np.argmax(bad)]))
            raise ValueError(f"character {ch!r} (U+{ord(ch):04X}) is not in the char vocabulary")
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        return self._cps[arr].astype("<u4").tobytes().decode("utf-32-le")

    def stream(self) -> StreamEncoder:
        return _CharStream(self)


class AlphabetScan:
    """Collects the distinct characters of a stream of text chunks (a flag per code point)."""

    def __init__(self) -> None:
        self._seen = np.zeros(0x110000, dtype=bool)

    def feed(self, text: str) -> None:
        if text:
            self._seen[_codepoints(text)] = True

    def tokenizer(self) -> CharTokenizer:
        """A CharTokenizer with ids in code-point order, so the same text always gives the same ids."""
        cps = np.flatnonzero(self._seen).astype("<u4")
        return CharTokenizer(cps.tobytes().decode("utf-32-le"))


# ---------------------------------------------------------------- bpe

def split_pieces(text: str, piece: int = BPE_PIECE_CHARS) -> list[str]:
    """Cut text into pieces of about `piece` characters at safe cuts (see `safe_cut`)."""
    out: list[str] = []
    pos = 0
    while len(text) - pos > piece:
        i = safe_cut(text, end=pos + piece, start=pos)
        if i < 0:
            break
        out.append(text[pos:i])
        pos = i
    if pos < len(text):
        out.append(text[pos:])
    return out


class _BpeStream:
    def __init__(self, tok: BpeTokenizer) -> None:
        self._tok = tok
        self._cut = TextCutter(cut=True)

    def feed(self, data: bytes) -> np.ndarray:
        return self._tok.encode(self._cut.feed(data))

    def finish(self) -> np.ndarray:
        return self._tok.encode(self._cut.finish())


class BpeTokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation, no prefix space) from `tokenizers`."""

    name = "bpe"

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, length: int | None = None) -> BpeTokenizer:
        """Train locally on a stream of texts; nothing is downloaded. Pre-tokens are GPT-2's, cut into pieces of
        at most BPE_MAX_WORD bytes (linear time on a long run of one character)."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

        if vocab_size < BPE_MIN_VOCAB:
            raise ValueError(f"BPE vocab_size must be at least {BPE_MIN_VOCAB}, got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([   # after ByteLevel one character is one byte
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            pre_tokenizers.Split(Regex(f".{{1,{BPE_MAX_WORD}}}"), behavior="isolated")])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tok.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | Path) -> BpeTokenizer:
        from tokenizers import Tokenizer  # noqa: PLC0415

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        """tokenizer.json (what `tokenizers` writes), through Python's file API: a failed write is an OSError."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.tok.to_str(pretty=True))

    def encode(self, text: str) -> np.ndarray:
        if not text:
            return _EMPTY
        batch = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # _fast: no offsets (>= 0.21)
        encs = batch(split_pieces(text), add_special_tokens=False)
        return np.concatenate([np.asarray(e.ids, dtype=np.uint32) for e in encs])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def stream(self) -> StreamEncoder:
        return _BpeStream(self)


# ---------------------------------------------------------------- loading

def load_tokenizer(data_dir: str | Path) -> Tokenizer:
    """The tokenizer a prepared DATA_DIR was made with (from its meta.json)."""
    from planner.datameta import load_data_meta  # noqa: PLC0415

    meta = load_data_meta(data_dir)
    if meta.tokenizer == "byte":
        return ByteTokenizer()
    if meta.tokenizer == "char":
        return CharTokenizer(meta.chars or "")
    return BpeTokenizer.from_file(Path(data_dir) / str(meta.tokenizer_file))

