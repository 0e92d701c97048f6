"""The channel through which a worker tells `nanoplan run` its exit code (runner/launcher.py, runner/stop_record.py):
the status and stop-request files live in the run dir, one pair per node, a stale pair from a launcher killed with
-9 is not this launch's, and a worker writes its status in place over bytes the launcher reserved.

run_torchrun runs whatever command it is given: here a one-line Python "worker", no torchrun and no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from runner.launcher import STATUS_BYTES, LaunchWriteError, reserve_status, run_torchrun, status_files
from runner.stop_record import EXIT_WRITE, write_status
from tests.conftest import REPO, runner_env

WORKER = """
import os, sys
from pathlib import Path
from runner.stop_record import report_exit
stop = Path(os.environ["NANOPLAN_STOP_FILE"])
print("stop asked" if stop.exists() else "no stop", flush=True)
sys.exit(report_exit(int(sys.argv[1]), sys.argv[2] * int(sys.argv[3])))
"""


def run_worker(run: Path, code: int, error: str = "", repeat: int = 1, node_rank: int = 0) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return run_torchrun([sys.executable, "-c", WORKER, str(code), error, str(repeat)], env, run, node_rank=node_rank)


def temp_names() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("nanoplan-status-")}


def test_a_deliberate_exit_code_comes_back_through_the_run_dir(tmp_path: Path, capfd) -> None:
    before = temp_names()
    status, stop = status_files(tmp_path)
    status.write_text(json.dumps({"exit_code": 3, "error": "an earlier launch's"}))   # left by a kill -9
    stop.write_text("SIGTERM\n")
    assert run_worker(tmp_path, EXIT_WRITE, "disk full") == EXIT_WRITE    # the worker itself exited 0
    assert "no stop" in capfd.readouterr().out                             # the stale stop request was not read
    assert run_worker(tmp_path, 0) == 0                                    # not the stale 3, not the last 4
    assert not status.exists() and not stop.exists()
    assert temp_names() == before


def test_nodes_have_their_own_files_and_a_long_error_is_cut_to_fit(tmp_path: Path) -> None:
    assert [p.name for p in status_files(tmp_path, 2)] == [".nanoplan.node2.status.json", ".nanoplan.node2.status.stop"]
    status, _ = status_files(tmp_path)
    reserve_status(status)
    write_status(status, EXIT_WRITE, "é" * 50_000)
    assert status.stat().st_size == STATUS_BYTES              # in place: not one byte more than reserved
    got = json.loads(status.read_text())
    assert got["exit_code"] == EXIT_WRITE and got["error"].startswith("é" * 100) and got["error"].endswith(" ...")
    assert run_worker(tmp_path, EXIT_WRITE, "x", repeat=100_000, node_rank=2) == EXIT_WRITE


def test_a_link_in_place_of_the_status_file_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    status, _ = status_files(run)
    status.symlink_to(target)
    assert run_worker(run, EXIT_WRITE, "x") == EXIT_WRITE
    assert target.read_text() == "keep me\n" and not status.is_symlink()


FULL = """
import os
from pathlib import Path
from runner.launcher import reserve_status
from runner.metrics import write_json
from runner.stop_record import write_status
d = Path(os.environ["D"])
status = d / ".nanoplan.status.json"
reserve_status(status)
try:
    with open(d / "filler", "wb") as f:
        while True:
            f.write(b"x" * 1024)
            f.flush()
except OSError:
    pass
try:
    write_json(d / "stop.json", {"reason": "write_error"})
    print("room left")
except OSError as e:
    print("full, errno", e.errno)
write_status(status, 4, "disk full")
print(status.read_text().strip())
"""


def test_the_exit_code_is_written_on_a_really_full_disk(tmp_path: Path) -> None:
    """A 16 KiB tmpfs, filled after the launcher reserved the status file: a new file (the old way: a temp file,
    then a rename) fails with ENOSPC, the status is still written."""
    from tests.test_writes import tmpfs_ok  # noqa: PLC0415

    if not tmpfs_ok():
        pytest.skip("this kernel mounts no tmpfs in a user namespace (unshare -rm)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "D": str(tmp_path)}
    r = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=16k tmpfs "$D" || exit 99; "$@"', "sh",
                        sys.executable, "-c", FULL], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["full, errno 28", '{"exit_code": 4, "error": "disk full"}'], r.stdout


def test_a_folder_in_place_of_the_status_file_is_one_line_and_starts_nothing(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan()
    run = tmp_path / "run"
    status, _ = status_files(run)
    status.mkdir(parents=True)
    with pytest.raises(LaunchWriteError, match=r"\.nanoplan\.status\.json could not be written: .*EISDIR"):
        run_worker(run, 0)
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)], cwd=REPO,
                       env=runner_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1] == (f"error: {status} could not be written: Is a directory [errno EISDIR]; "
                                         "nothing was started (free disk space or fix the run dir, then run the "
                                         "same command)")
    assert not (run / "metrics.jsonl").exists() and status.is_dir()
