"""One trainer, as the supervisor (runner/trainers/supervise.py) sees it: the interface every adapter fills.

An adapter knows four things about its trainer, each read from the trainer's own source (cited in its
module): how to launch it (from the plan's command, planner/trainers/launch_files.py, plus the step count,
save cadence and resume flags the supervisor chose), where its checkpoints land and when one is complete,
how to resume it, and how to read its step lines. It holds no budget logic: the supervisor decides when to
launch, how many steps, how often to save and when to stop, the same way for every trainer.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlanError
from planner.plan import Plan

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NUMBER = r"[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"


def clean(line: str) -> str:
    """A log line without its terminal colours and carriage returns."""
    return ANSI.sub("", line).replace("\r", "").rstrip()


def number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


@dataclass(frozen=True)
class StepLine:
    """What one of the trainer's step lines says."""

    step: int                          # optimizer steps done when it was printed
    loss: float | None = None
    lr: float | None = None
    tokens_per_sec: float | None = None  # the whole run's, as the trainer measured it (None: not printed)
    total: int | None = None           # the trainer's own step count, when the line says it


@dataclass(frozen=True)
class Launch:
    """What one launch of the trainer is asked to do (the supervisor's choices)."""

    plan: Plan
    run_dir: Path
    trainer_dir: Path | None
    end_step: int                      # the step count it is launched with: it saves there and stops
    save_every: int                    # its save cadence, in steps
    resume_step: int | None            # the checkpoint it resumes from (None: a fresh start)

    @property
    def world(self) -> int:
        return self.plan.hardware.num_gpus


class Adapter:
    """A trainer under `nanoplan run`. Subclasses fill in the facts; see nanochat.py, torchtitan.py, deepspeed.py."""

    name = ""
    reshards = False       # can it resume a checkpoint on another GPU count
    stops_by = ""          # how it stops at its deadline, for the docs and messages

    # ---------------------------------------------------------------- what can be supervised
    def refuse(self, plan: Plan, plan_path: str) -> None:
        """Raise PlanError (one line) for a plan of this trainer that cannot be supervised."""

    def trainer_dir(self, given: str | None) -> Path | None:
        """Where the trainer's command runs (--trainer-dir, or its default); PlanError when unusable."""
        return Path(given).resolve() if given else None

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_dir(self, run_dir: Path) -> Path:
        raise NotImplementedError

    # a trainer that writes one directory per checkpoint (torchtitan's step-N, DeepSpeed's global_stepN): its
    # name as a pattern whose group is the step, and as a format; `steps` and `paths` then need nothing else
    step_dir_re: re.Pattern[str] | None = None
    step_dir_name = ""

    def steps(self, run_dir: Path) -> list[int]:
        """Every step with any checkpoint file (complete or not), ascending."""
        if self.step_dir_re is None:
            raise NotImplementedError
        try:
            names = [p.name for p in self.checkpoint_dir(run_dir).iterdir()]
        except OSError:
            return []
        return sorted(int(m[1]) for n in names if (m := self.step_dir_re.match(n)))

    def problem(self, run_dir: Path, step: int, world: int) -> str | None:
        """Why the checkpoint of `step` (written by `world` ranks) is not complete and loadable, or None."""
        raise NotImplementedError

    def written_by(self, run_dir: Path, step: int) -> int | None:
        """How many ranks wrote the checkpoint of `step`, as its files say (None: they do not say)."""
        return None

    def paths(self, run_dir: Path, step: int) -> list[Path]:
        """The files or directories that make up the checkpoint of `step` (to clean an unfinished one)."""
        if not self.step_dir_name:
            raise NotImplementedError
        p = self.checkpoint_dir(run_dir) / self.step_dir_name.format(step=step)
        return [p] if p.exists() or p.is_symlink() else []

    def run_files(self, run_dir: Path) -> list[Path]:
        """What else it writes in the run dir (never through a link: runner/trainers/records.py `link_in`)."""
        return []

    # ---------------------------------------------------------------- launching
    def prepare(self, launch: Launch) -> None:
        """Write what the command needs into the run dir (before each launch)."""

    def command(self, launch: Launch) -> list[str]:
        raise NotImplementedError

    def env(self, launch: Launch) -> dict[str, str]:
        """Variables to add to the trainer's environment."""
        return {}

    # ---------------------------------------------------------------- watching
    def parse(self, line: str, world: int) -> StepLine | None:
        """The step line `line` (colours already removed), or None for any other line."""
        raise NotImplementedError


# --------------------------------------------------------------------------- the trainer's environment

def trainer_python(trainer_dir: Path | None) -> str:
    """The trainer's own Python: its checkout's .venv (nanochat's speedrun makes one) when present, else the
    interpreter nanoplan runs in (nanoplan installed into the trainer's environment)."""
    if trainer_dir is not None:
        for name in ("python", "python3"):
            p = trainer_dir / ".venv" / "bin" / name
            if os.access(p, os.X_OK):
                return str(p)
    return sys.executable


def trainer_program(trainer_dir: Path | None, name: str) -> str:
    """A console script of the trainer's environment (e.g. `deepspeed`): beside its Python, else on PATH."""
    beside = Path(trainer_python(trainer_dir)).parent / name
    if os.access(beside, os.X_OK):
        return name if shutil.which(name) == str(beside) else str(beside)   # the bare name when PATH finds it
    found = shutil.which(name)
    if found is None:
        raise PlanError("--trainer-dir", f"`{name}` is not installed beside {trainer_python(trainer_dir)} nor on PATH",
                        f"install it into the trainer's environment (pip install {name})")
    return found


def torchrun_prefix(argv: list[str], python: str) -> list[str]:
    """`torchrun OPTS` of a plan's command as `PYTHON -m torch.distributed.run OPTS` (torchrun's own module,
    run by the trainer's Python), with no restarts: a crash ends the launch, and the supervisor relaunches it
    with the resume flag (torchrun's restart would run the same command, which resumes from nothing)."""
    assert argv and argv[0] == "torchrun", argv
    opts = [a for a in argv[1:] if not a.startswith("--max-restarts") and not a.startswith("--max_restarts")]
    return [python, "-m", "torch.distributed.run", "--max-restarts=0", *opts]


def set_flags(argv: list[str], values: dict[str, str | None], *, joined: bool = False) -> list[str]:
    """`argv` with each flag of `values` set: its earlier occurrences (`--f v` or `--f=v`) removed and
    `--f v` (or `--f=v` with `joined`) appended; a None value appends the bare flag."""
    drop = set(values)
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in drop:
            skip = "=" not in a and values[name] is not None
            continue
        out.append(a)
    for flag, v in values.items():
        if v is None:
            out.append(flag)
        elif joined:
            out.append(f"{flag}={v}")
        else:
            out += [flag, v]
    return out
