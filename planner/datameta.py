"""meta.json written by `nanoplan prepare-data` next to train.bin / val.bin (pure Python)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import PlanError, pydantic_one_line


class DataMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format_version: Literal[1] = 1
    tokenizer: Literal["byte", "char", "bpe"]
    vocab_size: int = Field(gt=0)
    dtype: Literal["uint16", "uint32"]
    train_tokens: int = Field(ge=0)
    val_tokens: int = Field(ge=0)
    sources: list[str] = []
    tokenizer_file: str | None = None   # bpe: tokenizer.json inside the data dir
    chars: str | None = None            # char: the alphabet, index = token id


def load_data_meta(data_dir: str | Path) -> DataMeta:
    p = Path(data_dir) / "meta.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError("--data", f"{p} does not exist", "run nanoplan prepare-data first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError("--data", f"cannot read {p}: {e}", "re-run nanoplan prepare-data") from None
    try:
        return DataMeta.model_validate(data)
    except ValidationError as e:
        raise PlanError(str(p), pydantic_one_line(e), "re-run nanoplan prepare-data") from None
