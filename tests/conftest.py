"""Shared fixtures: a tiny byte-level data dir and a builder for tiny 2xCPU plans."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from planner.build import build_plan
from planner.datameta import DataMeta
from planner.plan import Hyper, Plan, PlanRequest, save_plan
from planner.profiles import find_profile
from planner.spec import preset

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "examples" / "tiny" / "text.txt"


def write_data_dir(path: Path, text: bytes, val_fraction: float = 0.1, dtype: str = "uint16") -> Path:
    """A prepare-data style directory (byte tokenizer) written with numpy."""
    path.mkdir(parents=True, exist_ok=True)
    toks = np.frombuffer(text, dtype=np.uint8).astype(dtype)
    n_val = int(len(toks) * val_fraction)
    train, val = toks[: len(toks) - n_val], toks[len(toks) - n_val:]
    train.tofile(path / "train.bin")
    val.tofile(path / "val.bin")
    meta = DataMeta(tokenizer="byte", vocab_size=256, dtype=dtype, train_tokens=len(train), val_tokens=len(val),
                    sources=["examples/tiny/text.txt"])
    (path / "meta.json").write_text(meta.model_dump_json(indent=2))
    return path


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~48 KB of generated English as byte tokens (train 90%, val 10%)."""
    return write_data_dir(tmp_path_factory.mktemp("data"), TEXT.read_bytes())


PlanMaker = Callable[..., Path]


def make_tiny_plan(path: Path, data_dir: Path | None, *, gpus: int = 2, steps: int | None = 30,
                   hours: float | None = None, hyper: dict[str, Any] | None = None, **request: Any) -> Path:
    """A tiny-preset CPU plan (fp32, no compile) saved at `path`; one of steps/hours sets the length."""
    h = {"lr": 3e-3, "val_every_steps": 0, "warmup_steps": 0, "seed": 1234, **(hyper or {})}
    fields: dict[str, Any] = dict(
        gpu=f"{gpus}xCPU", profile=find_profile("CPU"), model=preset("tiny"), total_batch_tokens=512 * gpus,
        precision="fp32", compile=False, steps=None if hours else steps, hours=hours,
        data_dir=str(data_dir) if data_dir else None, hyper=Hyper(**h),
    )
    req = PlanRequest(**{**fields, **request})
    plan: Plan = build_plan(req, plan_path=str(path))
    save_plan(plan, path)
    return path


@pytest.fixture
def tiny_plan(tmp_path: Path, tiny_data: Path) -> PlanMaker:
    """make_plan(name="plan.json", **kw) -> path of a tiny 2xCPU plan over tiny_data."""

    def make(name: str = "plan.json", **kw: Any) -> Path:
        return make_tiny_plan(tmp_path / name, tiny_data, **kw)

    return make


def runner_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NANOPLAN_TENSORBOARD": "0", "PYTHONUNBUFFERED": "1", **extra}
    for k in ("NANOPLAN_FAULT", "NANOPLAN_TIME_SCALE", "NANOPLAN_CKPT_DELAY_S"):
        if k not in extra:
            env.pop(k, None)
    return env


def torchrun_cmd(plan: Path, run_dir: Path, nproc: int = 2, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "-m", "runner.train", "--plan", str(plan), "--run-dir", str(run_dir), *extra]


def torchrun(plan: Path, run_dir: Path, nproc: int = 2, *extra: str, timeout: float = 60,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_cmd(plan, run_dir, nproc, *extra), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=runner_env(**(env or {})))


def nanoplan_cli(args: list[str], capsys: pytest.CaptureFixture[str], cwd: Path) -> tuple[int, str, str]:
    """Run `nanoplan ARGS` in-process in `cwd` through the real entry point (which maps PlanError to exit 2):
    (exit code, stdout, stderr)."""
    from nanoplan.cli import main

    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["nanoplan", *args]
    os.chdir(cwd)
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    out = capsys.readouterr()
    return code, out.out, out.err


def nanoplan_no_launch(*argv: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `nanoplan ARGV` in-process; nothing is ever launched."""
    import contextlib
    import io
    from unittest import mock

    from nanoplan import cli

    out, err = io.StringIO(), io.StringIO()
    code: int | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd or Path.cwd()), \
            mock.patch("runner.launcher.run_torchrun", side_effect=AssertionError("launched")), \
            mock.patch.object(sys, "argv", ["nanoplan", *argv]):
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return int(code or 0), out.getvalue(), err.getvalue()
