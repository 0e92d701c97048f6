"""meta.json written by `nanoplan prepare-data` next to train.bin / val.bin (pure Python)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import PlanError, pydantic_one_line, strict_json_loads

TokenDtype = Literal["uint16", "uint32"]
UINT16_VOCAB_MAX = 65536  # token ids 0..65535 fit in uint16


def dtype_for_vocab(vocab_size: int) -> TokenDtype:
    """Smallest on-disk dtype that holds every token id 0..vocab_size-1."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= UINT16_VOCAB_MAX:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32")


class DataMeta(BaseModel):
    """What DATA_DIR holds. train.bin / val.bin are raw little-endian arrays of `dtype`."""

    model_config = ConfigDict(extra="forbid")
    format_version: Literal[1] = 1
    tokenizer: Literal["byte", "char", "bpe"]
    vocab_size: int = Field(gt=0)
    dtype: TokenDtype
    train_tokens: int = Field(ge=0)
    val_tokens: int = Field(ge=0)
    sources: list[str] = []
    tokenizer_file: str | None = None   # bpe: tokenizer.json inside the data dir
    chars: str | None = None            # char: the alphabet, index = token id
    val_fraction: float | None = Field(default=None, ge=0, lt=1)
    split_block_bytes: int | None = Field(default=None, gt=0)  # val split: tail of every block of this many bytes
    source_bytes: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> DataMeta:
        if self.dtype == "uint16" and self.vocab_size > UINT16_VOCAB_MAX:
            raise ValueError(f"dtype uint16 cannot hold vocab_size {self.vocab_size}; use uint32")
        if self.tokenizer == "byte" and self.vocab_size != 256:
            raise ValueError(f"the byte tokenizer has vocab_size 256, got {self.vocab_size}")
        if self.tokenizer == "char" and (self.chars is None or len(self.chars) != self.vocab_size):
            raise ValueError("the char tokenizer needs 'chars' with exactly vocab_size characters")
        if self.tokenizer == "bpe" and not self.tokenizer_file:
            raise ValueError("the bpe tokenizer needs 'tokenizer_file'")
        return self


def load_data_meta(data_dir: str | Path) -> DataMeta:
    p = Path(data_dir) / "meta.json"
    try:
        data = strict_json_loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError("--data", f"{p} does not exist", "run nanoplan prepare-data first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError("--data", f"cannot read {p}: {e}", "re-run nanoplan prepare-data") from None
    except (ValueError, RecursionError) as e:   # a duplicate key, a 5,000-digit number, nesting past the stack
        raise PlanError("--data", f"cannot read {p}: {str(e).split(';')[0][:120]}", "re-run nanoplan prepare-data") \
            from None
    try:
        return DataMeta.model_validate(data)
    except ValidationError as e:
        raise PlanError(str(p), pydantic_one_line(e), "re-run nanoplan prepare-data") from None
