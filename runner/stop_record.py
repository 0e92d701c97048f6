"""How a worker's run ends: its exit code, its one-line error, RUN_DIR/stop.json, and the status
file through which `nanoplan run` learns the code.

Exit codes: 0 a clean stop (budget, total_steps, patience, a signal), 2 bad input, 3 a loss that
is not finite, 4 a run file that could not be written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runner.checkpoint_layout import complete_steps, step_dir
from runner.launcher import ENV_STATUS, STATUS_BYTES, io_problem
from runner.metrics import STOP, write_json

EXIT_OK, EXIT_USAGE, EXIT_NAN, EXIT_WRITE = 0, 2, 3, 4
DELIBERATE = (EXIT_USAGE, EXIT_NAN, EXIT_WRITE)


def exit_code(reason: str | None) -> int:
    """The exit code of a run that stopped for `reason` (the stop reasons of runner/train.py)."""
    return {"nan": EXIT_NAN, "write_error": EXIT_WRITE}.get(str(reason), EXIT_OK)


def stop_error(reason: str | None, step: int, write_error: str | None, run_dir: Path,
               resumed_from: int | None = None) -> str | None:
    """The one-line error of a run that stopped for `reason`, with its fix; None for a clean stop.
    `resumed_from`: the checkpoint step this launch resumed from (its state may be what is poisoned)."""
    if reason == "nan":
        if resumed_from is not None:
            ck = step_dir(run_dir, resumed_from)
            return (f"the loss is not finite at step {step}; stopped without a checkpoint. This launch resumed from "
                    f"{ck}: its model or optimizer state may be poisoned (move it and any later step_* dirs out of "
                    f"{ck.parent} to resume from an earlier checkpoint); else lower request.hyper.lr in the plan, "
                    "or check the data")
        return ("the loss is not finite; stopped without a checkpoint "
                "(lower request.hyper.lr in the plan, or check the data)")
    if reason == "write_error":
        good = complete_steps(run_dir)
        kept = f"step_{good[-1]:08d} is the last checkpoint" if good else "there is no checkpoint yet"
        return (f"{write_error}; stopped at step {step}, {kept} "
                "(free disk space or fix the run dir, then run the same command to resume)")
    return None


def record_stop(run_dir: Path, data: dict[str, Any]) -> bool | str:
    """Write RUN_DIR/stop.json; True, or the problem when that fails too (a full or broken disk)."""
    try:
        write_json(run_dir / STOP, data)
        return True
    except OSError as e:
        return io_problem(run_dir / STOP, e)


def report_exit(code: int, error: str | None = None) -> int:
    """The process's exit code.

    When `nanoplan run` launched this worker it sets NANOPLAN_STATUS_FILE (one per node):
    local rank 0 writes {"exit_code", "error"} there, and a deliberate failure (bad input, a
    NaN loss, a failed checkpoint write) exits 0. A non-zero exit would make torchrun restart
    into the same failure (--max-restarts) and print its ChildFailedError report; nanoplan run
    exits with the recorded code instead. Without the variable (plain torchrun) the code is
    returned as is.
    """
    status = os.environ.get(ENV_STATUS)
    if not status:
        return code
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            write_status(Path(status), code, error)
        except OSError:
            return code
    return EXIT_OK if code in DELIBERATE else code


def write_status(path: Path, code: int, error: str | None) -> None:
    """{"exit_code", "error"} into the status file: in place over the bytes the launcher reserved
    (runner.launcher.reserve_status: no new block is needed, so it works on a full disk), the error cut to fit;
    a file nobody reserved (NANOPLAN_STATUS_FILE set by hand) is created."""
    def encoded(err: str | None) -> bytes:
        return json.dumps({"exit_code": code, "error": err}).encode()

    data = encoded(error)
    while len(data) > STATUS_BYTES and error:
        error = error[: len(error) // 2]
        data = encoded(error + " ...")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.pwrite(fd, data.ljust(os.fstat(fd).st_size, b" "), 0)
    finally:
        os.close(fd)
