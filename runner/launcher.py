"""Builds the torchrun command for a plan and runs it, turning a signalled stop into exit 0.

torchrun itself exits non-zero when it is signalled, even when every worker checkpointed and
exited 0. So `nanoplan run` starts torchrun in its own session and, on SIGTERM, SIGINT or
SIGHUP (a closed terminal), asks the training workers (torchrun's children) to stop, once:

- it creates the launch's stop-request file (NANOPLAN_STOP_FILE, holding the signal's name),
  which every worker reads right after installing its own handlers, and which a worker that
  torchrun restarts reads too: a stop asked for at any moment is never lost;
- it sends SIGTERM only to workers whose SIGTERM handler is installed (/proc/PID/status
  SigCgt): a worker still importing torch would die of it, and torchrun would restart it.

The workers finish the step, write a checkpoint and exit 0, and torchrun then exits 0 as well.
If torchrun was signalled directly too, RUN_DIR/stop.json (reason "signal", written by this
launch) still makes the exit code 0. A second signal while no worker has installed its
handlers yet (torchrun starting, a multi-node rendezvous waiting for the other nodes) stops
torchrun itself: exit 130. torchrun dies with `nanoplan run` (PR_SET_PDEATHSIG, SIGTERM), so
even `kill -9` of the launcher makes the workers checkpoint and stop. Plain Python: no torch.

Nothing goes outside the run dir: the status and stop-request files are RUN_DIR/.nanoplan.status.json and
.nanoplan.status.stop (`.nanoplan.node{R}.status.*` on node rank R), under the node's launch lock
(runner.runlock), removed at the start of a launch (one left by a launcher killed with -9) and at its end; the
status file's bytes are reserved by the launcher, so a worker reports its exit code even on a full disk; and
torchrun's own per-launch log folder (its default is a new `torchelastic_*` folder in the system's temp dir,
never removed) is RUN_DIR/torchrun (`PET_LOG_DIR`, torchrun's `--log-dir`; workers' error.json files land there).
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from planner.launch import DEFAULT_MAX_RESTARTS, torchrun_command, torchrun_env
from planner.plan import Plan
from runner.clock import ENV_LAUNCH_ID
from runner.ledger import HEARTBEAT_S
from runner.metrics import STOP, read_json

SHUTDOWN_MIN_S = 60
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_INTERRUPTED = 130          # stopped by a signal before any worker could take over the stop
ENV_STOP_FILE = "NANOPLAN_STOP_FILE"   # exists once a stop was asked for; holds the signal's name


def build_command(plan: Plan, plan_path: str, run_dir: str, *, nnodes: int | None = None, node_rank: int = 0,
                  rdzv_endpoint: str | None = None, max_restarts: int = DEFAULT_MAX_RESTARTS,
                  data: str | None = None, resume: bool = False, force: bool = False) -> list[str]:
    """`python -m torch.distributed.run ... -m runner.train --plan P --run-dir D [...]` for this plan."""
    extra: list[str] = []
    if data:
        extra += ["--data", data]
    if resume:
        extra.append("--resume")
    if force:
        extra.append("--force")
    return torchrun_command(plan_path, plan.hardware.gpus_per_node, run_dir, nnodes=nnodes or plan.hardware.nodes,
                            node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts,
                            python=sys.executable, extra=extra)


def shutdown_timeout_s(plan: Plan) -> int:
    """Seconds torchrun waits for signalled workers: one step plus a slow (50 MB/s) checkpoint write, ×3."""
    s = plan.schedule
    return max(SHUTDOWN_MIN_S, math.ceil(3 * (plan.throughput.step_seconds + s.checkpoint_bytes / 50e6)))


def launch_env(plan: Plan, base: dict[str, str] | None = None, run_dir: str | Path | None = None) -> dict[str, str]:
    """The environment torchrun runs in: planner.launch.torchrun_env (a fresh rendezvous store for each round of
    restarts; with `run_dir`, its log folders in RUN_DIR/torchrun, module docstring), the shutdown timeout and, on
    a CPU, the threads per worker. A value already set wins."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(shutdown_timeout_s(plan)))
    for k, v in torchrun_env(None if run_dir is None else str(run_dir)).items():
        env.setdefault(k, v)
    if plan.request.profile.kind == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // plan.hardware.gpus_per_node)))
    return env


def wait_gone(pids: list[int], timeout_s: float) -> None:
    """Wait until none of `pids` is alive (or timeout_s passes)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(pid_alive(pid) for pid in pids):
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Running: not gone, and not a zombie that a container's init never reaps."""
    if Path("/proc/self").exists():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc), empty where unavailable."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out += [int(x) for x in text]
    except OSError:
        return []
    return out


def _same_program(pid: int, parent: int) -> bool:
    """Whether `pid` still runs its parent's program (forked, not yet exec'd: same command line); True where unknown."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == Path(f"/proc/{parent}/cmdline").read_bytes()
    except OSError:
        return Path("/proc/self/cmdline").exists()


def handles_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM installed (Linux /proc SigCgt); True where unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError, IndexError):
        return not Path("/proc/self/status").exists()
    return True


def _say(text: str) -> None:
    """A line on stderr that never raises (the terminal may be gone: SIGHUP)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class StopRequests:
    """Catches SIGTERM/SIGINT/SIGHUP from the moment `nanoplan run` starts, before torchrun exists.

    Before the launch a signal interrupts whatever runs (the preflight, a --probe) with one line,
    "error: interrupted by SIGINT before the launch; nothing was started", and exit 130. Once
    torchrun runs, `run_torchrun` takes the handler over.
    """

    def __init__(self, what: str = "before the launch; nothing was started") -> None:
        self.names: list[str] = []
        self.what = what
        self.on_signal: Callable[[str], None] | None = None
        self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.names.append(name)
        if self.on_signal is None:
            import typer

            _say(f"error: interrupted by {name} {self.what}")
            raise typer.Exit(EXIT_INTERRUPTED)
        self.on_signal(name)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """preexec_fn for torchrun: SIGTERM it when `nanoplan run` dies (Linux prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def preexec() -> None:
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)        # PR_SET_PDEATHSIG
        if os.getppid() != parent:                           # the parent died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


ENV_STATUS = "NANOPLAN_STATUS_FILE"   # runner.stop_record.report_exit writes {"exit_code", "error"} there
STATUS_BYTES = 4096                   # reserved by the launcher; the worker overwrites them in place, space-padded


def status_files(run_dir: str | Path, node_rank: int = 0) -> tuple[Path, Path]:
    """(status file, stop-request file) of this node's launch in the run dir (module docstring)."""
    base = ".nanoplan.status" if node_rank == 0 else f".nanoplan.node{node_rank}.status"
    return Path(run_dir) / f"{base}.json", Path(run_dir) / f"{base}.stop"


def reserve_status(path: Path) -> None:
    """A fresh status file of STATUS_BYTES spaces (a stale one, or a link, is removed first: never followed)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, b" " * STATUS_BYTES)
    finally:
        os.close(fd)


def run_torchrun(cmd: list[str], env: dict[str, str], run_dir: str | Path, *, stops: StopRequests | None = None,
                 heartbeat: Callable[[], None] | None = None, pass_fds: tuple[int, ...] = (),
                 node_rank: int = 0) -> int:
    """Run torchrun to completion, stopping it cleanly on SIGTERM/SIGINT/SIGHUP. Returns the exit code.

    Workers that stop on purpose with an error (bad input, NaN loss, failed write) exit 0, so
    that torchrun neither restarts them nor prints a traceback, and leave their real exit code
    in the status file; that code is returned here. `heartbeat` is called about once a
    second while torchrun runs; `pass_fds` are inherited by torchrun (the run-dir lock, held for this
    `node_rank`). LaunchWriteError when the status file cannot be made (nothing was started).
    """
    status, stop_file = status_files(run_dir, node_rank)
    stops = stops or StopRequests()
    try:
        try:
            stop_file.unlink(missing_ok=True)        # a stop asked of a launcher killed with -9 is not this launch's
            reserve_status(status)
        except OSError as e:
            raise LaunchWriteError(f"{io_problem(status, e)}; nothing was started (free disk space or fix the run "
                                   "dir, then run the same command)") from None
        rc = _run_torchrun(cmd, {**env, ENV_STATUS: str(status.absolute()), ENV_STOP_FILE: str(stop_file.absolute())},
                           run_dir, stops, str(stop_file), heartbeat, pass_fds)
        if rc == 0:
            rc = int((read_json(status) or {}).get("exit_code") or 0)
        return rc
    finally:
        stops.restore()
        for p in (status, stop_file):
            with suppress(OSError):              # a folder in their place: reported above, left as it is
                p.unlink(missing_ok=True)


def _run_torchrun(cmd: list[str], env: dict[str, str], run_dir: str | Path, stops: StopRequests, stop_file: str,
                  heartbeat: Callable[[], None] | None, pass_fds: tuple[int, ...]) -> int:
    if stops.names:
        _say(f"nanoplan run: got {stops.names[0]} before the launch; nothing was started")
        return EXIT_INTERRUPTED
    stops.on_signal = lambda name: None       # recorded in stops.names while torchrun is being spawned
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, pass_fds=pass_fds,
                            preexec_fn=_die_with_parent(os.getpid()))  # noqa: PLW1509 - only prctl, no locks
    state: dict[str, Any] = {"signalled": 0, "sent": set(), "interrupted": False}

    def tell_workers() -> None:
        """SIGTERM every worker that has its handler installed and has not been told yet.

        A child that torchrun has forked but not yet exec'd still shows torchrun's own handlers
        (SigCgt) and its command line: it is skipped, since it loses those handlers at the exec."""
        for pid in child_pids(proc.pid):
            if pid not in state["sent"] and not _same_program(pid, proc.pid) and handles_sigterm(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                    state["sent"].add(pid)
                except ProcessLookupError:
                    pass

    def on_signal(name: str) -> None:
        state["signalled"] += 1
        if state["signalled"] == 1:
            try:
                Path(stop_file).write_text(name + "\n")   # first: workers starting up read it after their handlers
            except OSError:
                pass
            tell_workers()
            _say(f"nanoplan run: got {name}; asking the workers to finish the step and checkpoint")
            return
        if not state["sent"] and not state["interrupted"]:
            state["interrupted"] = True   # no worker could take the stop yet: stop torchrun itself
            _say(f"nanoplan run: got {name} again before any worker started; stopping torchrun")
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            return
        _say(f"nanoplan run: already stopping, waiting for the checkpoint (kill -9 {proc.pid} to abort)")

    stops.on_signal = on_signal
    if stops.names:
        on_signal(stops.names[-1])            # one that came while torchrun was being spawned
    while True:
        try:
            rc = proc.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            if state["signalled"]:
                tell_workers()          # workers that installed their handlers since
            if heartbeat is not None:
                heartbeat()
        except KeyboardInterrupt:  # pragma: no cover - the handler replaces SIGINT
            continue
    if state["signalled"]:
        # torchrun's agent can die of repeated signals while its workers still write the final
        # checkpoint (they are not killed): wait for them before reading stop.json.
        wait_gone(list(state["sent"]), float(env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_MIN_S)))
        stop = read_json(Path(run_dir) / STOP) or {}
        if stop.get("reason") == "signal" and stop.get("job") and stop.get("job") == env.get(ENV_LAUNCH_ID):
            return 0                    # the workers stopped cleanly (the status file may still say 4)
        if state["interrupted"]:
            return EXIT_INTERRUPTED
    return rc


class LaunchWriteError(Exception):
    """The launch could not write its record into the run dir (disk full, I/O error): exit 4."""


def io_problem(path: Path | str, e: OSError) -> str:
    """'PATH could not be written: No space left on device [errno ENOSPC]' (planner.writes.write_problem)."""
    from planner.writes import write_problem

    return write_problem(path, e)


class Launch:
    """What `nanoplan run` holds while it runs: the run-dir lock and this launch's budget record.

    The clock starts at the launcher's own process start (t0, CLOCK_BOOTTIME seconds): the
    Python start-up, preflight, torchrun and the rendezvous all count.
    """

    def __init__(self, run_dir: Path, *, node_rank: int, plan_hash: str, launch_id: str, t0: float,
                 scale: float, budget_key: str | None = None) -> None:
        """`budget_key`: planner.plan.budget_key of the plan (what the run is, whatever its checkpoint cadence);
        without it the launch's budget follows the plan hash only, and a changed cadence starts a new budget."""
        self.run_dir, self.node_rank, self.plan_hash, self.id = run_dir, node_rank, plan_hash, launch_id
        self.t0, self.scale = t0, scale
        self.budget_key, self.source_key = budget_key, budget_key
        self.lock: Any = None
        self.record: dict[str, Any] | None = None
        self._beats: Any = None
        self._warned = False

    def acquire(self) -> None:
        """Lock the run dir, or raise PlanError (exit 2) naming the PID and host that hold it."""
        from planner.errors import PlanError
        from runner.runlock import TRAIN_LOCK, RunDirBusy, RunLock, launch_lock_name, probe

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.lock = RunLock.acquire(self.run_dir, launch_lock_name(self.node_rank), "nanoplan run")
        except RunDirBusy as e:
            raise PlanError("--run-dir", str(e), f"wait for that run to end, or stop it (kill -TERM {e.pid} on "
                            f"{e.host}); two launches on one run dir would corrupt each other") from None
        except OSError as e:
            raise PlanError("--run-dir", f"{self.run_dir} cannot be locked ({e.strerror or e})",
                            "pick another --run-dir") from None
        if self.node_rank == 0:
            held = probe(self.run_dir, TRAIN_LOCK)
            if held is not None:    # workers of a launcher that was killed, or a plain torchrun
                self.release()
                e2 = RunDirBusy(self.run_dir, held)
                raise PlanError("--run-dir", str(e2), f"wait for it to end, or stop it (kill -TERM {e2.pid} "
                                f"on {e2.host})")

    def spent_s(self) -> float:
        """Real seconds since the launcher started (counted 1:1, as a first attempt's start-up is)."""
        from runner.clock import boottime

        return max(0.0, boottime() - self.t0)

    def carried_s(self, also: tuple[str, ...] = ()) -> float:
        """Budget seconds the run had used before this launch (runner.ledger.spent_before_s)."""
        from runner.ledger import spent_before_s

        return spent_before_s(self.run_dir, self.plan_hash, also, key=self.budget_key)

    def start(self, *, source_hash: str | None = None, also: tuple[str, ...] = (),
              carried_s: float | None = None) -> None:
        """Persist this launch (node rank 0) before anything is spawned, and keep its time on a
        heartbeat thread from then on; LaunchWriteError if the first write fails.

        `source_hash`: the plan the user passed, when this launch runs a plan made from it (`--probe`).
        """
        from runner.ledger import LEDGER, PREPAID_S, Heartbeat, write_record

        if self.node_rank != 0:
            return
        import socket

        carried = self.carried_s(also) if carried_s is None else carried_s
        self.record = {"id": self.id, "plan_hash": self.plan_hash, "source_hash": source_hash or self.plan_hash,
                       "host": socket.gethostname(), "pid": os.getpid(), "carried_s": carried,
                       "spent_s": self.spent_s() + PREPAID_S, "state": "running"}
        if self.budget_key is not None:
            self.record.update(budget_key=self.budget_key, source_key=self.source_key or self.budget_key)
        try:
            write_record(self.run_dir, self.record)
        except OSError as e:
            raise LaunchWriteError(f"{io_problem(self.run_dir / LEDGER, e)}; nothing was started "
                                   "(free disk space or fix the run dir, then run the same command)") from None
        self._beats = Heartbeat(self._beat).start()

    def ran_plan(self, plan_hash: str, budget_key: str | None = None) -> None:
        """The plan this launch runs is now known (after `--probe`): its record says so from here on."""
        self.plan_hash = plan_hash
        if budget_key is not None:
            self.budget_key = budget_key
        if self.record is not None:
            self.record["plan_hash"] = plan_hash
            if budget_key is not None:
                self.record["budget_key"] = budget_key
            self.heartbeat()

    def _beat(self, final: bool) -> None:
        """Rewrite this launch's spent time: PREPAID_S ahead while it runs, exact at the end (best effort:
        the workers' own writes report a full disk)."""
        from runner.ledger import LEDGER, PREPAID_S, write_record

        if self.record is None:
            return
        self.record.update(spent_s=self.spent_s() + (0.0 if final else PREPAID_S))
        try:
            write_record(self.run_dir, dict(self.record))
        except (OSError, ValueError) as e:
            if not self._warned and isinstance(e, OSError):
                self._warned = True
                _say(f"warning: {io_problem(self.run_dir / LEDGER, e)}; this launch's time is counted up to here")

    def heartbeat(self) -> None:
        """One beat now (the heartbeat thread beats every HEARTBEAT_S by itself)."""
        if self._beats is not None:
            self._beats.now()

    def finish(self, state: str = "ended") -> None:
        """The last, exact record of this launch (its state: ended, interrupted); only the first call counts."""
        if self.record is not None and self._beats is not None:
            beats, self._beats = self._beats, None
            self.record["state"] = state
            beats.stop()

    def pass_fds(self) -> tuple[int, ...]:
        return (self.lock.fd,) if self.lock is not None and self.lock.fd >= 0 else ()

    @contextmanager
    def held(self, stops: StopRequests | None) -> Iterator[Launch]:
        """The run dir locked for this launch (acquire: PlanError, exit 2, if another process holds it); when the
        block ends, its record's last state (ended; interrupted by a signal; failed) and the lock released."""
        self.acquire()
        try:
            yield self
            self.finish("ended")
        except BaseException:
            self.finish("interrupted" if stops is not None and stops.names else "failed")
            raise
        finally:
            self.release()

    def release(self) -> None:
        self.finish()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
