"""Issue 30 #8, the smaller ones: duplicate keys in a profile YAML; a 5,000-digit integer or deep nesting in a
profile, a data meta.json or a metrics line; calibrate on a sparse metrics file or one with a non-UTF-8 byte;
the TensorBoard-link hint that named a --force which was then refused. (`--plot` at a directory: test_writes.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, make_tiny_plan

CAL = REPO / "tests" / "data" / "calibration" / "tiny-1cpu"
H100 = REPO / "hardware_profiles" / "H100-SXM.yaml"
BIG = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000


def nanoplan(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


def one_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errs = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errs) == 1, r.stderr
    return errs[0]


def test_a_duplicate_key_in_a_profile_is_refused_naming_it(tmp_path: Path) -> None:
    text = H100.read_text()
    assert text.count("\ndefault_provider: ") == 1
    (tmp_path / "p.yaml").write_text(text + "default_provider: runpod\n")          # the price would change
    line = text[: text.index("\ndefault_provider: ")].count("\n") + 2
    err = one_error(nanoplan("estimate", "--profile", str(tmp_path / "p.yaml"), "--depth", "12", "--hours", "1",
                             "--out", str(tmp_path / "plan.json")))
    last = len((tmp_path / "p.yaml").read_text().splitlines())
    assert err == (f"error: {tmp_path / 'p.yaml'}: not valid YAML at line {last}: the key 'default_provider' appears "
                   f"twice (lines {line} and {last})"), err
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("where", ["profile", "meta.json", "metrics line", "run_info.json"])
@pytest.mark.parametrize("value", ["big", "deep"])
def test_a_huge_number_or_deep_nesting_is_one_line(where: str, value: str, tmp_path: Path, tiny_data: Path) -> None:
    v = BIG if value == "big" else DEEP
    if where == "profile":
        (tmp_path / "p.yaml").write_text(H100.read_text() + f"extra: {v}\n")
        r = nanoplan("estimate", "--profile", str(tmp_path / "p.yaml"), "--depth", "12", "--hours", "1")
    elif where == "meta.json":
        data = tmp_path / "data"
        shutil.copytree(tiny_data, data)
        meta = (data / "meta.json").read_text()
        (data / "meta.json").write_text(meta.replace("{", '{"extra": ' + v + ",", 1))
        r = nanoplan("estimate", "--gpu", "CPU", "--preset", "tiny", "--steps", "10", "--data", str(data), "--out",
                     "/dev/null")
    else:
        run = tmp_path / "run"
        shutil.copytree(CAL, run)
        name = "metrics.jsonl" if where == "metrics line" else "run_info.json"
        text = (run / name).read_text()
        (run / name).write_text(text.replace("{", '{"extra": ' + v + ",", 1))
        r = nanoplan("calibrate", str(run))
    one_error(r)


def test_calibrate_reads_a_sparse_metrics_file_a_chunk_at_a_time_and_skips_a_bad_byte(tmp_path: Path) -> None:
    """A 512 MiB sparse tail (a crash can leave one) was read whole (2 GB took 4.2 GB of RAM); one byte that is
    not UTF-8 refused the whole run, where `nanoplan run` skips the line."""
    run = tmp_path / "run"
    shutil.copytree(CAL, run)
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    lines[9] = lines[9].replace(b'"device": "cpu"', b'"device": "c\xffu"')
    with open(run / "metrics.jsonl", "wb") as f:
        f.write(b"\n".join(lines))
        f.seek(512 * 2**20, 1)                                               # a hole of NUL bytes, then a newline
        f.write(b"\n")
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.stdout[-2000:]); "
            "print(r.stderr[-2000:], file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "nanoplan", "calibrate", str(run)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    rc, maxrss_kib = (int(x) for x in r.stdout.split("\n", 1)[0].split())
    assert rc == 0, r.stderr
    assert maxrss_kib < 300 * 1024, maxrss_kib                               # not the file's size
    said = " ".join(r.stdout.split())
    assert "skipped 1 line(s) that are not UTF-8 text (line 10)" in said, r.stdout
    assert "skipped 1 line(s) that are longer than a metrics line (line 41)" in said, r.stdout


def test_a_linked_tensorboard_dir_is_refused_without_naming_force(tmp_path: Path, tiny_data: Path) -> None:
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=5)
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "victim").mkdir()
    (run / "tensorboard").symlink_to(tmp_path / "victim")
    outs = [nanoplan("run", str(plan), "--run-dir", str(run), *extra) for extra in ([], ["--force"])]
    for r in outs:
        assert r.returncode == 2, r.stderr
        assert [x for x in r.stderr.splitlines() if x.startswith(("error:", "hint:"))] == [
            f"error: preflight: {run / 'tensorboard'} is a link to {tmp_path / 'victim'}, outside the run dir {run}; "
            "the runner only writes inside its run dir",
            "hint: remove the link, or pass the real directory as --run-dir"], r.stderr
    assert json.dumps(sorted(p.name for p in (tmp_path / "victim").iterdir())) == "[]"
