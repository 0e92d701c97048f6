"""`nanoplan export-model`'s file: a checkpoint's model as one ``torch.save`` state dict, written safely.

zero2/fsdp checkpoints hold DCP shards, consolidated with ``dcp_to_torch_save`` in this process (it
needs host memory for the whole model); a ddp/zero1 checkpoint's model.pt is already one. Every
read is weights-only (runner/torch_files.load_torch): a model.pt that holds pickled objects is a
one-line PlanError that never suggests loading it unsafely.

The file is written to `.NAME.wPID-HOST.XXXXXXXX.tmp` beside the target (runner/temps.py), fsynced,
checked by loading it back, and renamed. An export killed with -9 leaves that temporary (up to the
model's size, in the run dir by default); the next export into the same directory removes those of
dead writers. A failed write (disk full, I/O error, a file-size limit) is one line, exit 4
(planner/writes.py), never torch's "unexpected pos 704 vs 598": torch's zip writer hides the OSError,
so the bytes go through a sink that keeps it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from planner.errors import PlanError
from planner.writes import failed
from runner.temps import clean_dead, make_temp

DONE = "nothing was written there"


class _Sink:
    """A binary file for torch.save that keeps the first OSError of a write (torch's writer turns it into a
    RuntimeError about positions, or swallows it until the flush)."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            self.error = self.error or e
            raise


def clean_dead_exports(directory: Path) -> tuple[int, int]:
    """Remove the temporaries of exports into `directory` killed before they finished: (files, bytes)."""
    return clean_dead(directory, lambda name: name.endswith(".pt"))


def export_model_file(step_path: Path, out: Path) -> tuple[dict[str, torch.Tensor], tuple[int, int]]:
    """Write the checkpoint's model at `out` (temp file + rename); (the state dict loaded back with
    weights_only=True, as a user would; the (files, bytes) of killed exports' temporaries removed).
    WriteFailed (exit 4) when the file cannot be written; PlanError for a checkpoint that cannot be read."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from runner.dcp import MODEL_DIR, check_metadata, has_shards
    from runner.torch_files import load_torch

    removed = clean_dead_exports(out.parent)
    try:
        tmp = make_temp(out)
    except OSError as e:
        raise failed(out, e, "--out", DONE) from None
    sink: _Sink | None = None
    try:
        with open(tmp, "wb") as f:
            sink = _Sink(f)
            if has_shards(step_path):
                check_metadata(step_path / MODEL_DIR)
                try:
                    dcp_to_torch_save(step_path / MODEL_DIR, sink)   # type: ignore[arg-type]  # torch.save takes a file
                except (Exception, CheckpointException) as e:  # noqa: BLE001 - an untrusted checkpoint: one line
                    if sink.error is not None:
                        raise sink.error from None
                    why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                    raise PlanError(str(step_path / MODEL_DIR), f"cannot be consolidated ({why})",
                                    "export another --step") from None
            else:
                sd = load_torch(step_path / "model.pt")
                if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
                    raise PlanError(str(step_path / "model.pt"), "is not a state dict of tensors", "export another --step")
                try:
                    torch.save(sd, sink)   # type: ignore[arg-type]
                except RuntimeError:
                    if sink.error is not None:
                        raise sink.error from None
                    raise
            f.flush()
            os.fsync(f.fileno())
        sd = load_torch(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except OSError as e:
        raise failed(out, sink.error if sink is not None and sink.error is not None else e, "--out", DONE) from None
    finally:
        tmp.unlink(missing_ok=True)
    return sd, removed
