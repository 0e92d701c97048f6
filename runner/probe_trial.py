"""One trial of `nanoplan probe` as processes: its torchrun started, time-boxed, killed, and read back.

A trial's torchrun starts in its own session and dies with the probe's process (PR_SET_PDEATHSIG:
SIGTERM, so it stops its workers); each worker dies with its torchrun (SIGKILL) and ends itself at
the trial's deadline (NANOPLAN_TRIAL_DEADLINE). Past its time box the probe kills the process groups
of torchrun and of every worker (workers start their own sessions; their pids are in the trial
directory). Plain Python: torch runs in the trials only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

KILL_GRACE_S = 5.0            # SIGTERM, then SIGKILL after this
OOM_TEXT = ("OutOfMemoryError", "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "NCCL error: out of memory")
ENV_TRIAL_DEADLINE = "NANOPLAN_TRIAL_DEADLINE"     # CLOCK_BOOTTIME second at which a trial's worker ends itself
EXIT_TRIAL_ORPHAN = 124       # a trial's worker that outlived its torchrun or its deadline


class ProbeWriteError(Exception):
    """The probe cannot write where it must (read-only, full, not a directory): one line, exit 4."""


def _write_problem_line(path: Path, e: OSError, done: str = "nothing was probed") -> str:
    from runner.launcher import io_problem  # noqa: PLC0415

    return f"{io_problem(path, e)}; {done} (free disk space, or give the probe another --dir or --out)"



# ---------------------------------------------------------------------------- one trial's processes


def hold_trial_worker() -> None:
    """Called first in a trial's worker (runner/probe_worker.py): it dies with its torchrun (Linux
    PR_SET_PDEATHSIG, SIGKILL: a trial keeps nothing worth a clean exit), and ends itself at the
    trial's deadline (NANOPLAN_TRIAL_DEADLINE, set by run_trial), whatever happened to the probe."""
    import ctypes  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from runner.clock import boottime  # noqa: PLC0415

    if sys.platform.startswith("linux") and os.environ.get("TORCHELASTIC_RUN_ID"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)     # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        try:
            parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        except OSError:
            parent = b""
        if b"torch.distributed.run" not in parent and b"torchrun" not in parent:
            os._exit(EXIT_TRIAL_ORPHAN)                  # torchrun died before the prctl took effect
    try:
        deadline = float(os.environ.get(ENV_TRIAL_DEADLINE, ""))
    except ValueError:
        return

    def watch() -> None:
        while (left := deadline - boottime()) > 0:
            time.sleep(min(left, 1.0))
        os._exit(EXIT_TRIAL_ORPHAN)

    threading.Thread(target=watch, name="trial-deadline", daemon=True).start()



def descendants(pid: int) -> list[int]:
    """Every process under `pid` (Linux /proc), children first."""
    from runner.launcher import child_pids  # noqa: PLC0415

    out, todo = [], [pid]
    while todo:
        kids = child_pids(todo.pop())
        out += kids
        todo += kids
    return out


def _is_worker(pid: int) -> bool:
    """A live probe worker (checked before killing a pid read from a file)."""
    try:
        return b"runner.probe_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def trial_pids(proc: subprocess.Popen, trial_dir: Path) -> list[int]:
    pids = descendants(proc.pid)
    for f in trial_dir.glob("pid_rank*"):
        try:
            pid = int(f.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid not in pids and _is_worker(pid):
            pids.append(pid)
    return pids


def kill_trial(proc: subprocess.Popen, trial_dir: Path) -> None:
    """End a trial: SIGTERM to the process group of torchrun and of every worker, SIGKILL after a grace."""
    from runner.launcher import pid_alive, wait_gone  # noqa: PLC0415

    pids = trial_pids(proc, trial_dir)
    mine = os.getpgrp()
    groups = set()
    for pid in [proc.pid, *pids]:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(mine)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            wait_gone([proc.pid, *pids], KILL_GRACE_S)
            if not any(pid_alive(p) for p in [proc.pid, *pids]):
                break
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_trial(cmd: list[str], env: dict[str, str], trial_dir: Path, timeout_s: float) -> tuple[bool, int | None]:
    """Run one trial's torchrun in its own session; (timed out, exit code). Leaves nothing running.

    torchrun dies with this process (PR_SET_PDEATHSIG: SIGTERM, so it stops its workers), and its
    workers end themselves at the trial's deadline plus KILL_GRACE_S (NANOPLAN_TRIAL_DEADLINE), so a
    probe killed in any way leaves no trial behind.
    """
    from runner.clock import boottime  # noqa: PLC0415
    from runner.launcher import _die_with_parent  # noqa: PLC0415

    env = {**env, ENV_TRIAL_DEADLINE: repr(boottime() + timeout_s + KILL_GRACE_S)}
    try:
        log = open(trial_dir / "log.txt", "xb")  # noqa: SIM115 - a fresh trial dir: never through a link
    except OSError as e:
        raise ProbeWriteError(_write_problem_line(trial_dir / "log.txt", e)) from None
    with log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                preexec_fn=_die_with_parent(os.getpid()))  # noqa: PLW1509 - only prctl, no locks
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_trial(proc, trial_dir)
            return True, None
        except BaseException:          # a signal (Ctrl-C, SIGTERM, SIGHUP) or an error in the probe itself
            kill_trial(proc, trial_dir)
            raise
        if any(_is_worker(p) for p in trial_pids(proc, trial_dir)):   # a worker torchrun did not reap
            kill_trial(proc, trial_dir)
        return False, rc


def read_trial(trial_dir: Path, timed_out: bool, rc: int | None, timeout_s: float) -> tuple[str, dict | None, str]:
    """(status, the worker's record, a note) of a finished trial."""
    from planner.probe import FAILED, NO_FIT, OK, TIMED_OUT  # noqa: PLC0415

    def load(p: Path) -> dict | None:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    ooms = [r for p in sorted(trial_dir.glob("oom_rank*.json")) if (r := load(p)) is not None]
    if ooms:
        return NO_FIT, ooms[0], f"rank {ooms[0].get('rank')}: {ooms[0].get('error')}"
    if timed_out:
        return TIMED_OUT, None, f"killed at the {timeout_s:.0f} s time box"
    res = load(trial_dir / "result.json")
    if rc == 0 and res is not None and res.get("status") == "ok":
        return OK, res, ""
    tail = _log_tail(trial_dir / "log.txt")
    if any(t in tail for t in OOM_TEXT):
        return NO_FIT, None, "out of memory (from the log)"
    last = next((ln for ln in reversed(tail.splitlines()) if ln.strip().startswith("error:")), "")
    return FAILED, None, f"exit {rc}" + (f": {last.strip()}" if last else f"; see {trial_dir / 'log.txt'}")


def _log_tail(path: Path, n: int = 20_000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", errors="replace")
