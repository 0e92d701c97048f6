"""Installs without the extras (issue 28): a command that needs an optional package that is not installed says
so in one line naming the extra to install, exit 2, never a traceback (and `run`/`probe` say it before they start
another process, where a missing torch showed only as that process's failure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, make_tiny_plan, torchrun

# runs `nanoplan ARGS` with the listed top-level modules made unimportable (None in sys.modules)
CODE = """
import sys
blocked = sys.argv[1].split(",")
for name in blocked:
    sys.modules[name] = None
sys.argv = ["nanoplan", *sys.argv[2:]]
from nanoplan.cli import main
main()
"""


def nanoplan_without(blocked: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CODE, blocked, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


def one_error(res: subprocess.CompletedProcess, what: str, extra: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-1500:]
    assert "Traceback" not in res.stderr and "Error while finding module" not in res.stderr
    assert lines[0].startswith(f"error: {what}: needs ") and f"'{extra}' extra" in lines[0], lines
    assert lines[1].startswith("hint: ") and f".[{extra}]" in lines[1], lines
    assert len(lines) == 2, lines


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A plan and a run dir with a checkpoint (a real 2-step run on one process)."""
    from tests.conftest import TEXT, write_data_dir

    tmp = tmp_path_factory.mktemp("extras")
    data = write_data_dir(tmp / "data", TEXT.read_bytes())
    plan = make_tiny_plan(tmp / "plan.json", data, gpus=1, steps=2)
    res = torchrun(plan, tmp / "run", 1)
    assert res.returncode == 0, res.stderr[-2000:]
    return plan, tmp / "run"


@pytest.mark.parametrize(("blocked", "args", "what", "extra"), [
    ("torch", ("validate", "{plan}", "--trace"), "validate --trace", "train"),
    ("torch", ("run", "{plan}", "--run-dir", "{tmp}/r"), "run", "train"),
    ("torch", ("probe", "{plan}", "--dir", "{tmp}/p", "--out", "{tmp}/p.json"), "probe", "train"),
    ("torch", ("export-model", "{run}", "--out", "{tmp}/m.pt"), "export-model", "train"),
    ("tokenizers", ("prepare-data", str(REPO / "examples/tiny/text.txt"), "--out", "{tmp}/d", "--tokenizer", "bpe"),
     "prepare-data", "bpe"),
    ("matplotlib", ("compare", "--budget", "100", "--gpus", "8xH100", "--plot", "{tmp}/c.png"), "--plot", "plot"),
])
def test_a_missing_extra_is_one_line_naming_it(tiny_run: tuple[Path, Path], tmp_path: Path, blocked: str,
                                               args: tuple[str, ...], what: str, extra: str) -> None:
    plan, run = tiny_run
    argv = [a.format(plan=plan, run=run, tmp=tmp_path) for a in args]
    one_error(nanoplan_without(blocked, *argv, cwd=tmp_path), what, extra)
    assert not (tmp_path / "r").exists() and not (tmp_path / "p").exists()   # nothing was started


def test_planning_needs_no_extra(tmp_path: Path) -> None:
    res = nanoplan_without("torch,matplotlib,tokenizers,fvcore,tensorboard", "estimate", "--gpu", "8xH100",
                           "--depth", "12", "--hours", "1", "--out", str(tmp_path / "p.json"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-1500:]
    res = nanoplan_without("torch", "validate", str(tmp_path / "p.json"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-1500:]
