"""Schemas of the files a run writes and reads back (plain Python and pydantic; no torch).

A run reads its own files again on resume: a checkpoint's meta.json, run_info.json, best.json and
metrics.jsonl. They may have been edited by hand, or damaged. Each is validated on read, and a
problem names the file and the field (`problem_of`), never a traceback. What happens then depends
on what the file is for:

- checkpoints/step_N/meta.json: the checkpoint is not usable (like a failed checksum); the run falls
  back to the previous checkpoint, and with none left refuses to start (exit 2). meta.json carries
  its own sha256 (`meta_sha256`, over its canonical JSON without that key), so an edit is caught
  even when every value is well-typed.
- run_info.json: it carries the budget spent by earlier attempts, so a bad one stops the run before
  training (exit 2, file and field named); fix the field, or delete the file (the budget carried in
  the checkpoints and metrics.jsonl still counts).
- best.json: only a pointer; a bad one is ignored with a warning and rewritten at the next
  checkpoint that has a validation loss (retention also keeps the lowest val_loss among the metas).
- metrics.jsonl: a log. A torn line (a kill mid-write: the JSON just stops) is skipped silently,
  wherever it is (a resumed run appends after it). Any other bad line, unparseable JSON or a wrong
  type or NaN in a known field, is skipped with a warning naming file:line and field.

Known fields are checked; unknown extra fields are kept (extra="allow") in metrics lines,
run_info.json and meta.json, so that files written by a newer nanoplan still read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import DuplicateKeyError, pydantic_one_line, strict_json_loads

Fin = dict(allow_inf_nan=False)
NonNeg = Annotated[float, Field(ge=0, **Fin)]
MaybeFloat = Annotated[float | None, Field(**Fin)]
MAX_INT = 2**63 - 1


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricsRow(_Open):
    """One line of metrics.jsonl (see runner/metrics.py); older lines may lack the newer keys."""

    step: int = Field(ge=0, le=MAX_INT, strict=True)
    total_steps: int | None = Field(default=None, ge=0)
    loss: MaybeFloat = None          # null when the loss was not finite
    val_loss: MaybeFloat = None
    lr: MaybeFloat = None
    grad_norm: MaybeFloat = None
    tokens_per_sec: MaybeFloat = None
    mfu: MaybeFloat = None
    step_seconds: MaybeFloat = None
    elapsed_hours: Annotated[float | None, Field(ge=0, **Fin)] = None
    usd_spent: Annotated[float | None, Field(ge=0, **Fin)] = None
    tokens_seen: int | None = Field(default=None, ge=0)
    epoch: MaybeFloat = None
    segment: int | None = Field(default=None, ge=0)
    world_size: int | None = Field(default=None, gt=0)


class Segment(_Open):
    """One launch in run_info.json's segments."""

    segment: int | None = Field(default=None, ge=0)
    start_time: str | None = None
    resumed_from_step: int | None = Field(default=None, ge=0)
    world_size: int | None = Field(default=None, gt=0)
    restart_count: int | None = Field(default=None, ge=0)
    job: str | None = None
    clock_start_unix: Annotated[float | None, Field(ge=0, **Fin)] = None
    carried_hours: Annotated[float | None, Field(ge=0, **Fin)] = None


class RunInfo(_Open):
    plan_hash: str | None = None
    plan_path: str | None = None
    data_dir: str | None = None
    world_size: int | None = Field(default=None, gt=0)
    start_time: str | None = None
    segments: list[Segment] = []


class LaunchRecord(_Open):
    """One launch in launches.json (runner/ledger.py)."""

    id: str = Field(strict=True)
    plan_hash: str = Field(strict=True)
    host: str = Field(strict=True)
    state: str = Field(strict=True)
    carried_s: float = Field(ge=0, strict=True, **Fin)
    spent_s: float = Field(ge=0, strict=True, **Fin)


class Ledger(_Open):
    launches: list[LaunchRecord]


class Best(_Closed):
    step: int = Field(ge=0, le=MAX_INT, strict=True)
    val_loss: MaybeFloat
    path: str


class FileEntry(_Closed):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class Patience(_Open):
    best_val_loss: MaybeFloat = None
    evals_since_best: int = Field(default=0, ge=0)


class CheckpointMeta(_Open):
    """checkpoints/step_N/meta.json (runner/checkpoint.py, runner/train.py)."""

    format_version: int = Field(ge=1)
    step: int = Field(ge=0, le=MAX_INT, strict=True)
    world_size: int = Field(gt=0)
    files: dict[str, FileEntry]
    plan_hash: str | None = None
    total_steps: int | None = Field(default=None, gt=0)
    elapsed_hours: NonNeg = 0.0
    usd_spent: NonNeg = 0.0
    val_loss: MaybeFloat = None
    write_seconds: Annotated[float | None, Field(ge=0, **Fin)] = None
    eval_seconds: Annotated[float | None, Field(ge=0, **Fin)] = None
    tokens_seen: int | None = Field(default=None, ge=0)
    segment: int | None = Field(default=None, ge=0)
    patience: Patience | None = None
    data: dict[str, Any] | None = None
    schedule: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    meta_sha256: str | None = None


def parse_json(text: str | bytes) -> Any:
    """JSON that refuses duplicate keys (DuplicateKeyError) and keeps NaN for the schema to name."""
    return strict_json_loads(text)


def problem_of(model: type[BaseModel], data: Any, source: str) -> tuple[BaseModel | None, str | None]:
    """(validated model, None) or (None, "SOURCE: field 'X': why")."""
    if not isinstance(data, dict):
        return None, f"{source}: must hold a JSON object, not {type(data).__name__}"
    try:
        return model.model_validate(data), None
    except ValidationError as e:
        return None, pydantic_one_line(e, source)


def read_json_file(path: Any) -> tuple[Any, str | None]:
    """(data, None), (None, None) when the file is absent, or (None, problem) when it is not JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{path}: cannot be read ({getattr(e, 'strerror', None) or type(e).__name__})"
    try:
        return parse_json(text), None
    except DuplicateKeyError as e:
        return None, f"{path}: {e}"
    except (ValueError, RecursionError) as e:
        return None, f"{path}: is not valid JSON ({str(e).splitlines()[0][:120]})"


def meta_checksum(meta: dict[str, Any]) -> str:
    """sha256 of a meta.json's canonical JSON (sorted keys, no spaces), without its meta_sha256 key."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(meta: dict[str, Any]) -> dict[str, Any]:
    """meta with its meta_sha256 set."""
    return {**meta, "meta_sha256": meta_checksum(meta)}
