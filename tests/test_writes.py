"""Issue 30 #5 and #6, issue 28's `--out` into a missing directory: one write path (planner/writes.py).

- A full disk: every command that writes a user's file (estimate --out and --plot, compare --plot,
  export --out, export-model, calibrate --out, prepare-data) says one `error:` line naming the file
  and errno, exits 4, and leaves no temporary behind. The disk is really full: a 4 KiB tmpfs, filled,
  mounted in a user namespace (`unshare -rm`) where the kernel allows one; elsewhere a file-size limit
  (RLIMIT_FSIZE with SIGXFSZ ignored: the same write() fails with EFBIG). Both reach the real write.
- `--out /nonexistent/dir/plan.json` is one line, exit 2, and makes nothing; one missing folder is made.
- export-model killed with -9 leaves a temporary named for its writer; the next export removes it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch

from runner.checkpoint import write_meta
from runner.torch_files import sha256_file
from tests.conftest import REPO, TEXT, runner_env
from tests.test_reliability_faults import wait_for

CAL = REPO / "tests" / "data" / "calibration" / "tiny-1cpu"
FULL_SH = ('mount -t tmpfs -o size=4k tmpfs "$D" && head -c 4096 /dev/zero > "$D/.filler" || exit 99; '
           '"$@"; rc=$?; ls -A "$D" > "$L"; exit $rc')


@cache
def tmpfs_ok() -> bool:
    """Whether this kernel lets us mount a tmpfs in a user namespace (unshare -rm)."""
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=4k tmpfs $d"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


def _fsize_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))


def on_full_disk(args: list[str], full: Path, how: str = "tmpfs") -> tuple[subprocess.CompletedProcess, list[str]]:
    """`nanoplan ARGS` with the directory `full` on a full disk; (its result, what is left in `full`)."""
    full.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "nanoplan", *args]
    if how == "tmpfs":
        listing = full.parent / f".{full.name}.listing"
        env = {**runner_env(), "D": str(full), "L": str(listing)}
        r = subprocess.run(["unshare", "-rm", "sh", "-c", FULL_SH, "sh", *cmd], capture_output=True, text=True,
                           timeout=180, cwd=REPO, env=env)
        assert r.returncode != 99, r.stderr
        left = [x for x in listing.read_text().split() if x != ".filler"]
        return r, left
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=runner_env(),
                       preexec_fn=_fsize_limit)  # noqa: PLW1509 - a signal and an rlimit, nothing else
    return r, sorted(os.listdir(full))


def assert_one_write_error(r: subprocess.CompletedProcess, path: Path, left: list[str]) -> None:
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("warning: ")]   # export: no data
    assert r.returncode == 4, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"error: {path} could not be written: "), lines
    assert ("No space left on device [errno ENOSPC]" in lines[0] or "File too large [errno EFBIG]" in lines[0]), lines
    assert not [x for x in left if x.endswith(".tmp")], left            # no temporary left behind


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with one complete checkpoint (a 256 KiB model.pt, sealed as the runner seals it)."""
    run = tmp_path_factory.mktemp("writes") / "run"
    step = run / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    torch.save({"w": torch.arange(65536, dtype=torch.float32)}, step / "model.pt")
    write_meta(step, {"format_version": 2, "step": 1, "world_size": 1,
                      "files": {"model.pt": {"sha256": sha256_file(step / "model.pt"),
                                             "bytes": (step / "model.pt").stat().st_size}}})
    return run


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("gpuplan") / "plan.json"
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "8xH100", "--depth", "12", "--hours",
                        "1", "--out", str(p)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return p


CASES = {
    "estimate --out": lambda f, _p, _r: (["estimate", "--gpu", "CPU", "--preset", "tiny", "--steps", "10",
                                          "--out", str(f / "plan.json")], f / "plan.json"),
    "estimate --plot": lambda f, _p, _r: (["estimate", "--gpu", "8xH100", "--depth", "12", "--steps", "10",
                                           "--out", "/dev/null", "--plot", str(f / "m.png")], f / "m.png"),
    "compare --plot": lambda f, _p, _r: (["compare", "--budget", "100", "--gpus", "8xH100,8xA100",
                                          "--plot", str(f / "c.png")], f / "c.png"),
    "export --out": lambda f, p, _r: (["export", str(p), "--slurm", "--out", str(f / "job.sbatch")], f / "job.sbatch"),
    "export-model": lambda f, _p, r: (["export-model", str(r), "--out", str(f / "m.pt")], f / "m.pt"),
    "calibrate --out": lambda f, _p, _r: (["calibrate", str(CAL), "--out", str(f / "p.yaml")], f / "p.yaml"),
    "prepare-data": lambda f, _p, _r: (["prepare-data", str(TEXT), "--out", str(f / "data")], f / "data" / "train.bin"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_full_disk_is_one_line_and_exit_4_for_every_command(case: str, tmp_path: Path, gpu_plan: Path,
                                                             exported_run: Path) -> None:
    how = "tmpfs" if tmpfs_ok() else "fsize"
    args, target = CASES[case](tmp_path / "full", gpu_plan, exported_run)
    r, left = on_full_disk(args, tmp_path / "full", how)
    assert_one_write_error(r, target, left if case != "prepare-data" else [])
    if case == "prepare-data" and how == "fsize":
        assert not [x for x in os.listdir(tmp_path / "full" / "data") if x.endswith(".tmp")]


def test_a_file_size_limit_is_one_line_too(tmp_path: Path) -> None:
    """The same write path where no tmpfs can be mounted: write() fails with EFBIG under RLIMIT_FSIZE."""
    args, target = CASES["estimate --out"](tmp_path / "full", None, None)
    r, left = on_full_disk(args, tmp_path / "full", "fsize")
    assert_one_write_error(r, target, left)
    assert left == []


def test_dev_full_is_written_to_and_fails_in_one_line(tmp_path: Path) -> None:
    """A device is written to directly (a rename would replace it): /dev/null discards, /dev/full fails."""
    base = [sys.executable, "-m", "nanoplan", "estimate", "--gpu", "CPU", "--preset", "tiny", "--steps", "10", "--out"]
    r = subprocess.run([*base, "/dev/full"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 4 and r.stderr.strip().splitlines() == [
        "error: /dev/full could not be written: No space left on device [errno ENOSPC]; nothing was written there "
        "(free disk space, or give --out another path)"], r.stderr
    r = subprocess.run([*base, "/dev/null"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0 and Path("/dev/null").is_char_device(), r.stderr


@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_a_missing_chain_of_folders_is_one_line_and_makes_nothing(tmp_path: Path, option: str) -> None:
    """Issue 28: `--out /nonexistent/dir/plan.json` made both folders. At most the last folder is made."""
    name = "plan.json" if option == "--out" else "m.png"
    target = tmp_path / "nonexistent" / "dir" / name
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "CPU", "--preset", "tiny", "--steps",
                        "10", option, str(target)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {option}: the directory {tmp_path / 'nonexistent'} does not exist",
        f"hint: nanoplan makes at most the last folder of a path; create the rest first (mkdir -p "
        f"{tmp_path / 'nonexistent' / 'dir'}), or check the path for a typo"], r.stderr
    assert not (tmp_path / "nonexistent").exists() and r.stdout == ""
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "CPU", "--preset", "tiny", "--steps",
                        "10", "--out", str(tmp_path / "plans" / "p.json")], capture_output=True, text=True, timeout=60,
                       cwd=REPO)
    assert r.returncode == 0 and json.loads((tmp_path / "plans" / "p.json").read_text())["schema_version"] == 1


def test_plot_at_a_directory_is_one_line(tmp_path: Path) -> None:
    """Issue 30 #8: `--plot DIR` gave a traceback."""
    (tmp_path / "x.png").mkdir()
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "8xH100", "--depth", "12", "--steps",
                        "10", "--out", "/dev/null", "--plot", str(tmp_path / "x.png")], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith(("error:", "hint:"))] == [
        f"error: --plot: {tmp_path / 'x.png'} is a directory",
        f"hint: give a file name, e.g. --plot {tmp_path / 'x.png'}/chart.png"], r.stderr


def test_export_model_killed_leaves_a_temporary_the_next_export_removes(tmp_path: Path) -> None:
    """Issue 30 #6: export-model killed with -9 left its temporary (up to the model's size) and a later success
    did not remove it. The temporary names its writer; the next export into the directory removes those of dead
    writers (on this host, regular files only)."""
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    torch.save({"w": torch.zeros(24 * 2**20)}, step / "model.pt")          # 96 MiB: the write takes a while
    write_meta(step, {"format_version": 2, "step": 1, "world_size": 1,
                      "files": {"model.pt": {"sha256": sha256_file(step / "model.pt"),
                                             "bytes": (step / "model.pt").stat().st_size}}})
    cmd = [sys.executable, "-m", "nanoplan", "export-model", str(run)]
    p = subprocess.Popen(cmd, cwd=REPO, env=runner_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: p.poll() is not None or any(f.name.endswith(".tmp") for f in run.iterdir()), timeout=60,
                 what="export-model's temporary")
    finally:
        p.kill()
        p.wait()
    left = [f.name for f in run.iterdir() if f.name.endswith(".tmp")]
    assert p.returncode == -signal.SIGKILL and len(left) == 1 and left[0].startswith(".model_step_00000001.pt.w"), left
    (step / "model.pt").unlink()                                            # a small model for the second export
    torch.save({"w": torch.zeros(4)}, step / "model.pt")
    write_meta(step, {"format_version": 2, "step": 1, "world_size": 1,
                      "files": {"model.pt": {"sha256": sha256_file(step / "model.pt"),
                                             "bytes": (step / "model.pt").stat().st_size}}})
    other = run / ".model_step_00000001.pt.w1-elsewhere.abcdefgh.tmp"      # another host's writer: left alone
    other.write_bytes(b"x")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr
    assert sorted(f.name for f in run.iterdir() if f.name.endswith(".tmp")) == [other.name]
    assert "note: removed 1 temporary file(s)" in r.stderr and "by an export-model that was killed" in r.stderr
