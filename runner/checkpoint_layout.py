"""Where a run's checkpoints live: RUN_DIR/checkpoints/step_{step:08d}/, and which of them are complete.

What one step directory holds is written down in runner/checkpoint.py, which writes it. A
checkpoint is complete when its meta.json exists (written last); runner/checkpoint_meta.py
says whether it also verifies. Plain Python: no torch.
"""

from __future__ import annotations

from pathlib import Path

CKPT_DIR = "checkpoints"
META = "meta.json"
BEST = "best.json"
FORMAT_VERSION = 2      # 2: meta.json carries meta_sha256 (runner/runfiles.py); 1 is still read, without it
SHARDED_MODEL = "dcp/model/.metadata"   # zero2/fsdp checkpoints: DCP shards instead of model.pt (runner/dcp.py)


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def step_dir(run_dir: str | Path, step: int) -> Path:
    return ckpt_root(run_dir) / f"step_{step:08d}"


def list_steps(run_dir: str | Path) -> list[int]:
    """Steps of all checkpoint directories (complete or not), ascending."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            out.append(int(p.name[5:]))
    return sorted(out)


def complete_steps(run_dir: str | Path) -> list[int]:
    """Steps whose meta.json exists (not yet checksum-verified), ascending."""
    return [s for s in list_steps(run_dir) if (step_dir(run_dir, s) / META).is_file()]
