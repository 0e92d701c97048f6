"""The budget as a promise for other trainers (issue 32, "Done when"): `nanoplan run` of a nanochat, torchtitan and
DeepSpeed plan, with the stand-in trainers of tests/standins/ (each keeps its trainer's contract: flags,
checkpoint layout written in place, resume flag, step lines, no signal handler), killed and relaunched.

Per trainer, one seeded scenario (NANOPLAN_TRAINER_PROMISE_SEED picks another): the first launch is killed with
-9, its launcher alone (the keeper must then kill the trainer's whole tree), while a save is being written; the
second saves, is stalled (SIGSTOP of every process) and killed with -9, every process; the third runs to its end
(stalled on the way); a fourth starts nothing. Checked, with the tests' own reading of the files (torch.load,
pickle): each relaunch resumes from the newest complete checkpoint, a kill loses at most one save interval (the
cadence the launch was given), the real time of every launch (until its last process is gone) adds up to no
more than the budget plus one start-up, the run's records count that time, and the last save is the run's end.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runner import ledger
from runner.metrics import read_metrics
from tests.conftest import REPO, nanoplan_cli
from tests.launch_tree import LaunchTree
from tests.standins.standin_files import weights_at

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("NANOPLAN_TRAINER_PROMISE_SEED", "32"))
STANDINS = REPO / "tests" / "standins"
KEEP_FOR_LAST = 0.45    # the second launch's pauses and stall shrink to leave this share of the budget to the last one
KNOBS = {"STANDIN_STEP_S": "0.1", "STANDIN_SAVE_S": "0.1", "STANDIN_FILE_BYTES": "32768", "STANDIN_STARTUP_S": "0.3"}


# --------------------------------------------------------------------------- the tests' own view of the files

def torch_ok(p: Path) -> bool:
    import torch

    try:
        torch.load(p, weights_only=True)
        return True
    except Exception:      # noqa: BLE001 - any failure to load is "not complete"
        return False


def nanochat_steps(run: Path) -> list[int]:
    return sorted({int(m[1]) for p in (run / "checkpoints").glob("*") if (m := re.match(r"^\w+_(\d{6})", p.name))})


def nanochat_complete(run: Path, step: int, world: int) -> bool:
    d = run / "checkpoints"
    try:
        meta = json.loads((d / f"meta_{step:06d}.json").read_text())
    except (OSError, ValueError):
        return False
    return (meta.get("step") == step and torch_ok(d / f"model_{step:06d}.pt")
            and all(torch_ok(d / f"optim_{step:06d}_rank{r}.pt") for r in range(world)))


def nanochat_weights(run: Path, step: int) -> int:
    import torch

    return torch.load(run / "checkpoints" / f"model_{step:06d}.pt", weights_only=True)["x"]


def titan_dir(run: Path) -> Path:
    return run / "torchtitan" / "checkpoint"


def titan_steps(run: Path) -> list[int]:
    return sorted(int(m[1]) for p in titan_dir(run).glob("step-*") if (m := re.match(r"^step-(\d+)$", p.name)))


def titan_complete(run: Path, step: int, world: int) -> bool:
    d = titan_dir(run) / f"step-{step}"
    try:
        meta = pickle.loads((d / ".metadata").read_bytes())
        return all((d / i["relative_path"]).stat().st_size >= i["length"] for i in meta["storage_data"].values())
    except (OSError, pickle.UnpicklingError, EOFError, KeyError):
        return False


def titan_weights(run: Path, step: int) -> int:
    raw = (titan_dir(run) / f"step-{step}" / "__0_0.distcp").read_bytes()
    return pickle.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])["x"]


def ds_steps(run: Path) -> list[int]:
    return sorted(int(m[1]) for p in (run / "checkpoints").glob("global_step*")
                  if (m := re.match(r"^global_step(\d+)$", p.name)))


def ds_complete(run: Path, step: int, world: int) -> bool:
    d = run / "checkpoints" / f"global_step{step}"
    return all(torch_ok(d / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
               and torch_ok(d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt") for r in range(world))


def ds_weights(run: Path, step: int) -> int:
    import torch

    return torch.load(run / "checkpoints" / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_model_states.pt",
                      weights_only=True)["x"]


@dataclass
class Trainer:
    name: str
    plan: list[str]
    budget_s: float
    world: int
    steps: Callable[[Path], list[int]]
    complete: Callable[[Path, int, int], bool]
    weights: Callable[[Path, int], int]
    progress: re.Pattern          # a step line of the trainer's log: group 1, and its offset to steps done
    offset: int
    every: re.Pattern             # the save cadence in a launch's command line
    resume: re.Pattern            # the resume step in a launch's command line
    env: dict[str, str] = field(default_factory=dict)
    trainer_dir: Path | None = None
    later_save: bool = True       # the first launch is killed during a save after its first (else during its first)

    def newest(self, run: Path) -> int | None:
        done = [s for s in self.steps(run) if self.complete(run, s, self.world)]
        return max(done) if done else None

    def saving(self, run: Path) -> bool:
        """A save is being written: files of a step newer than the newest complete one, not complete (each look
        reads only the newest steps: it must be quick enough to catch a save of a few tenths of a second)."""
        steps = self.steps(run)
        for s in reversed(steps):
            if self.complete(run, s, self.world):
                return False
            return True
        return False


# --------------------------------------------------------------------------- one launch

class Launch(LaunchTree):
    """One `nanoplan run`, with every process it ever had (polled), and its real time."""

    def __init__(self, t: Trainer, plan: Path, run: Path, n: int, extra: tuple[str, ...] = ()) -> None:
        self.t = t
        self.offset = (run / "trainer.log").stat().st_size if (run / "trainer.log").exists() else 0
        args = [sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run), *extra]
        if t.trainer_dir is not None:
            args += ["--trainer-dir", str(t.trainer_dir)]
        super().__init__(args, run, run.parent / f"launch{n}.log", run.parent, t.env)

    def trainer_log(self) -> str:
        p = self.run / "trainer.log"
        return p.read_bytes()[self.offset:].decode(errors="replace") if p.exists() else ""

    def headers(self) -> list[str]:
        return [x for x in self.trainer_log().splitlines() if x.startswith("==> ")]

    def reached(self) -> int:
        """The most steps its trainer printed it had done."""
        return max((int(m[1]) + self.t.offset for m in self.t.progress.finditer(self.trainer_log())), default=0)

    def first_step(self) -> float:
        """Seconds from its start to its trainer's first step line: its start-up."""
        self.wait_until(lambda: self.reached() > 0, 120, f"{self.t.name}'s first step")
        return time.monotonic() - self.t0

    def wait_until(self, cond: Callable[[], object], timeout: float, what: str) -> None:
        """Until `cond` holds; the launch must still be running then."""
        super().wait_until(lambda: cond() or self.proc.poll() is not None, timeout, what)
        assert self.proc.poll() is None, self.output()[-3000:]


def left(run: Path, budget_s: float) -> float:
    """Budget seconds the run's records leave now (the live launch's record counts a beat ahead)."""
    return budget_s - max((r["carried_s"] + r["spent_s"] for r in ledger.read_ledger(run)), default=0.0)


def cadence(t: Trainer, header: str) -> int:
    return int(t.every.search(header)[1])


def resumed(t: Trainer, header: str) -> int | None:
    m = t.resume.search(header)
    return int(m[1]) if m else None


# --------------------------------------------------------------------------- the scenario

def promise(t: Trainer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch  # noqa: F401  (imported now: the first torch.load must not take seconds while a save is watched)

    rng = random.Random(f"{SEED}-{t.name}")
    code, _, err = nanoplan_cli(["estimate", *t.plan, "--hours", f"{t.budget_s / 3600:.6f}",
                                 "--checkpoint-every-minutes", "0.01", "--out", "plan.json"], capsys, tmp_path)
    assert code == 0, err
    plan, run = tmp_path / "plan.json", tmp_path / "run"
    run.mkdir()
    real: list[float] = []
    launches: list[Launch] = []
    log: list[str] = []
    try:
        # 1: killed with -9, its launcher alone, while a save is being written
        first = Launch(t, plan, run, 1)
        launches.append(first)
        first.first_step()
        if t.later_save:
            first.wait_until(lambda: t.newest(run) is not None, 60, "a first save")
        first.wait_until(lambda: t.saving(run), 60, "a save in progress")
        first.signal_all(signal.SIGKILL, launcher_only=True)
        real.append(first.wait_gone())
        newest = t.newest(run)
        lost = first.reached() - (newest or 0)
        assert lost <= cadence(t, first.headers()[-1]), (lost, first.headers()[-1])
        log.append(f"1: kill -9 of the launcher during a save at {real[-1]:.1f} s: step {first.reached()}, "
                   f"newest complete {newest}")

        # 2: resumes from the newest complete checkpoint, saving at the cadence of the step time measured
        segs = json.loads((run / "run_info.json").read_text())["segments"]
        measured = [x.get("mean_step_seconds") or x["step_seconds"] for x in segs if x.get("step_seconds")][-1]
        second = Launch(t, plan, run, 2)
        launches.append(second)
        second.first_step()
        assert resumed(t, second.headers()[0]) == newest, (second.headers()[0], newest)
        k_plan = json.loads(plan.read_text())["schedule"]["checkpoint_every_steps"]
        assert cadence(t, first.headers()[0]) == k_plan != cadence(t, second.headers()[0]) == round(0.6 / measured)
        second.wait_until(lambda: (t.newest(run) or 0) > (newest or 0), 60, "a save of the second launch")
        waits = [rng.uniform(0.3, 1.5), rng.uniform(0.5, 1.5), rng.uniform(0.2, 1.0)]   # pause, stall, pause
        fit = min(1.0, max(0.0, left(run, t.budget_s) - KEEP_FOR_LAST * t.budget_s) / sum(waits))   # a slow box
        time.sleep(waits[0] * fit)
        second.signal_all(signal.SIGSTOP)
        time.sleep(waits[1] * fit)
        second.signal_all(signal.SIGCONT)
        time.sleep(waits[2] * fit)
        second.signal_all(signal.SIGKILL)
        real.append(second.wait_gone())
        newest2 = t.newest(run)
        assert newest2 is None or newest is None or newest2 >= newest
        lost = second.reached() - (newest2 or 0)
        assert lost <= cadence(t, second.headers()[-1]), (lost, second.headers()[-1])
        log.append(f"2: stall, kill -9 of every process at {real[-1]:.1f} s: step {second.reached()}, "
                   f"newest complete {newest2}")

        # 3: resumes again, is stalled, and runs to its end
        third = Launch(t, plan, run, 3, ("--tensorboard",) if t.name == "nanochat" else ())
        launches.append(third)
        start_up = third.first_step()
        assert resumed(t, third.headers()[0]) == newest2, (third.headers()[0], newest2)
        time.sleep(rng.uniform(0.2, 1.0))
        third.signal_all(signal.SIGSTOP)
        time.sleep(rng.uniform(0.3, 1.0))
        third.signal_all(signal.SIGCONT)
        third.proc.wait(timeout=t.budget_s * 3)
        real.append(third.wait_gone())
        assert third.proc.returncode == 0, third.output()[-3000:]
        counted = ledger.read_ledger(run)[-1]
        log.append(f"3: start-up {start_up:.1f} s, to the end in {real[-1]:.1f} s")

        # 4: the run is over: nothing starts
        fourth = Launch(t, plan, run, 4)
        launches.append(fourth)
        fourth.proc.wait(timeout=60)
        real.append(fourth.wait_gone())
        log.append(f"4: {fourth.output().strip()} in {real[-1]:.1f} s")
    finally:
        for launch in launches:
            if launch.end is None:
                launch.kill()
    print(f"{t.name}, seed {SEED}, budget {t.budget_s:.0f} s:", *log, sep="\n  ")
    assert fourth.proc.returncode == 0 and fourth.output().startswith("nothing to do: "), fourth.output()
    assert ledger.read_ledger(run)[-1] == counted and fourth.pids == {fourth.proc.pid}
    total, used = sum(real), counted["carried_s"] + counted["spent_s"]
    print(f"real {total:.1f} s over {len(real)} launches, counted {used:.1f} s, one start-up {start_up:.1f} s")
    assert total <= t.budget_s + start_up, (total, t.budget_s, start_up)
    assert used >= sum(real[:3]) - 1.0, (used, real)
    stop = json.loads((run / "stop.json").read_text())
    final = t.newest(run)
    assert stop["reason"] in ("deadline", "total_steps") and stop["step"] == final, (stop, final)
    assert t.weights(run, final) == weights_at(final)      # every resume carried the right state
    rows = read_metrics(run)
    assert rows[-1]["step"] == final and rows[-1]["trainer"] == t.name and rows[-1]["usd_spent"] >= 0
    assert rows[-1]["tokens_per_sec"] > 0 and rows[-1]["seconds_to_stop"] is not None and rows[-1]["saved"] <= final
    assert stop["elapsed_hours"] * 3600 >= t.budget_s * 0.5, stop   # most of the budget was used
    if t.name == "nanochat":
        assert list((run / "tensorboard").glob("events.out.tfevents.*")), "--tensorboard wrote nothing"


def test_a_nanochat_cpu_run_killed_and_relaunched_keeps_the_budget(tmp_path: Path, capsys) -> None:
    """nanochat on a CPU (runs/runcpu.sh: one `python -m scripts.base_train`), its checkout given with
    --trainer-dir: the whole path of issue 32 on this machine."""
    env = {**os.environ, **KNOBS, "NANOCHAT_BASE_DIR": str(tmp_path / "base"), "NANOPLAN_TRAINER_STARTUP_S": "0.8"}
    t = Trainer("nanochat", ["--trainer", "nanochat", "--depth", "2", "--gpu", "CPU", "--precision", "fp32",
                             "--seq-len", "64", "--vocab-size", "256", "--device-batch-size", "1",
                             "--total-batch-tokens", "64"], 28.0, 1, nanochat_steps, nanochat_complete,
                nanochat_weights, re.compile(r"^step (\d+)/", re.M), 1, re.compile(r"--save-every=(\d+)"),
                re.compile(r"--resume-from-step=(\d+)"), env, STANDINS / "nanochat")
    promise(t, tmp_path, capsys)


def test_a_torchtitan_run_killed_and_relaunched_keeps_the_budget(tmp_path: Path, capsys) -> None:
    """torchtitan on 2 "GPUs" under torchrun (whose workers live in sessions of their own: the kill of the launcher
    alone must still end them); the stand-in package comes first on PYTHONPATH."""
    path = os.pathsep.join([str(STANDINS / "torchtitan_pkg"), os.environ.get("PYTHONPATH", str(REPO))])
    env = {**os.environ, **KNOBS, "PYTHONPATH": path, "NANOPLAN_TRAINER_STARTUP_S": "5"}
    t = Trainer("torchtitan", ["--trainer", "torchtitan", "--preset", "debugmodel", "--gpu", "2xH100",
                               "--device-batch-size", "1", "--total-batch-tokens", "4096", "--mfu", "0.005",
                               "--startup-seconds", "5"],           # planned with the start-up it is run with
                44.0, 2, titan_steps, titan_complete, titan_weights, re.compile(r"step:\s+(\d+)\s+"), 0,
                re.compile(r"--checkpoint\.interval (\d+)"), re.compile(r"--checkpoint\.load-step (\d+)"), env, None,
                later_save=False)    # torchrun's start-up is seconds: its first save, not the relaunch after it
    promise(t, tmp_path, capsys)


def test_a_deepspeed_run_killed_and_relaunched_keeps_the_budget(tmp_path: Path, capsys) -> None:
    """A DeepSpeed script (ZeRO-3, 2 ranks) in a directory whose own .venv holds the `deepspeed` launcher (the
    stand-in's) and its python: the trainer's own environment is used."""
    tdir = tmp_path / "job"
    (tdir / ".venv" / "bin").mkdir(parents=True)
    (tdir / "train.py").symlink_to(STANDINS / "deepspeed" / "train.py")
    for name, target in (("python", ""), ("deepspeed", str(STANDINS / "deepspeed" / "launcher.py"))):
        exe = tdir / ".venv" / "bin" / name
        exe.write_text(f'#!/bin/sh\nexec {sys.executable} {target} "$@"\n')
        exe.chmod(0o755)
    env = {**os.environ, **KNOBS, "NANOPLAN_TRAINER_STARTUP_S": "1.5"}
    t = Trainer("deepspeed", ["--trainer", "deepspeed", "--style", "gpt2", "--n-layer", "2", "--d-model", "64",
                              "--n-head", "2", "--vocab-size", "256", "--seq-len", "64", "--gpu", "2xH100",
                              "--device-batch-size", "1", "--total-batch-tokens", "128", "--mfu", "0.0000017",
                              "--startup-seconds", "1.5"],
                26.0, 2, ds_steps, ds_complete, ds_weights, re.compile(r"\bstep=(\d+), skipped"), 0,
                re.compile(r"--save-every (\d+)"), re.compile(r"--load-tag global_step(\d+)"), env, tdir)
    promise(t, tmp_path, capsys)
