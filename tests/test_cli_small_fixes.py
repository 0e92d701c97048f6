"""Small things a newcomer trips on (issue 23): both spellings of --gpu/--gpus, compare --steps, negative
amounts, hidden columns named, titles and long lines that wrap at the terminal's width, help with examples and
real metavars in every command, and every preflight problem on its own line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nanoplan.cli import COMMANDS
from nanoplan.common import wrap_command
from tests.conftest import REPO


def nanoplan(*args: str, columns: int = 80, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "COLUMNS": str(columns), "LINES": "24", **env}
    e.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=180,
                          env=e, cwd=cwd or REPO)


def test_compare_and_estimate_take_both_gpu_spellings_and_compare_takes_steps() -> None:
    a = nanoplan("compare", "--steps", "2k", "--preset", "gpt2", "--gpu", "8xH100,8xA100", "--format", "json")
    b = nanoplan("compare", "--steps", "2000", "--preset", "gpt2", "--gpus", "8xH100,8xA100", "--format", "json")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    rows = json.loads(a.stdout)
    assert [r["gpu"] for r in rows] == ["8xH100-SXM", "8xA100-80GB"] and json.loads(b.stdout) == rows
    assert all(r["tokens"] == 2000 * 524_288 for r in rows)       # 2,000 steps of the default batch, on each
    e = nanoplan("estimate", "--gpus", "2xH100", "--depth", "4", "--steps", "10", "--json")
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["hardware"]["num_gpus"] == 2
    two = nanoplan("compare", "--steps", "10", "--budget", "5")
    assert two.returncode == 2 and two.stderr.startswith("error: --steps: give exactly one of --budget, --hours or "
                                                         "--steps, not --budget and --steps")


@pytest.mark.parametrize("args, field", [
    (("estimate", "--budget", "-5"), "--budget"), (("compare", "--budget", "-5"), "--budget"),
    (("estimate", "--budget", "$-5k"), "--budget"), (("estimate", "--hours", "-2"), "--hours"),
    (("estimate", "--steps", "-20"), "--steps"), (("estimate", "--budget", "5", "--price", "-3"), "--price"),
])
def test_a_negative_amount_must_be_positive_in_one_line(args: tuple[str, ...], field: str) -> None:
    r = nanoplan(*args)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: {field}: must be positive, got {args[-1]!r}"], r.stderr


def test_profiles_names_the_columns_it_hides() -> None:
    narrow, wide = nanoplan("profiles", columns=80).stdout, nanoplan("profiles", columns=200).stdout
    hidden = [line for line in narrow.splitlines() if line.startswith("Hidden at this width:")]
    assert hidden == ["Hidden at this width: link GB/s, usable (--wide shows all)."], narrow
    header = next(line for line in narrow.splitlines() if line.startswith("name "))
    assert "link GB/s" not in header and "usable" not in header
    assert "Hidden" not in wide and "link GB/s" in wide
    every = nanoplan("profiles", "--wide", columns=80).stdout
    assert "link GB/s" in every and "usable" in every and "Hidden" not in every


def test_validate_title_wraps_at_the_terminal_not_the_table(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    assert nanoplan("estimate", "--depth", "4", "--steps", "10", "--out", str(plan)).returncode == 0
    title = "nanoplan validate: bytes per GPU (allocated peak; total adds the profile's overheads)"
    assert nanoplan("validate", str(plan), columns=120).stdout.splitlines()[0] == title
    at80 = nanoplan("validate", str(plan), columns=80).stdout.splitlines()
    assert " ".join(x.strip() for x in at80[:2]) == title and len(at80[0]) <= 80


_TYPE = re.compile(r"<(str|int|float|bool|path|list\[\w+\]|text|integer)>", re.I)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_help_has_examples_and_real_metavars(command: str) -> None:
    out = nanoplan(command, "--help", columns=80).stdout
    assert not _TYPE.search(out), (command, _TYPE.search(out))
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert "{" not in usage and "......" not in usage, usage
    examples = out.split("Examples", 1)[1].splitlines()
    commands = [x.strip() for x in examples if x.strip().startswith("nanoplan ")]
    assert commands and all(f"nanoplan {command}" in " ".join(commands) for _ in [0]), (command, commands)
    for i, line in enumerate(examples[:-1]):      # an example fits the line: the next line is a comment or empty
        if line.strip().startswith("nanoplan "):
            assert not examples[i + 1].strip() or examples[i + 1].strip().startswith("#"), (command, line)


def test_top_level_help_lists_every_command() -> None:
    out = nanoplan("--help", columns=100).stdout
    for command in COMMANDS:
        assert re.search(rf"│ {re.escape(command)} ", out), command


CMD = ["/opt/python/bin/python3.11", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
       "--nproc-per-node=2", "--max-restarts=3", "-m", "runner.train", "--plan", "runs/some-long-name/plan.probed.json",
       "--run-dir", "runs/some-long-name"]


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_a_long_command_wraps_between_words_and_pastes_back(width: int) -> None:
    import shlex

    text = wrap_command("launching: ", CMD, width)
    lines = text.splitlines()
    for x in lines:     # only an option with its value, or one word, alone on its line, may overflow
        assert len(x) <= width or len(x.removesuffix(" \\").split()) <= (2 if x.strip().startswith("-") else 1), x
    assert all(x.endswith(" \\") for x in lines[:-1])
    assert shlex.split(text.removeprefix("launching: ").replace("\\\n", " ")) == CMD
    assert any("--plan runs/some-long-name/plan.probed.json" in x for x in lines)   # an option keeps its value
    assert wrap_command("launching: ", CMD, None) == "launching: " + shlex.join(CMD)


def test_run_lists_every_preflight_problem_and_no_cuda_advice_without_a_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    plan = tmp_path / "gpu.json"
    assert nanoplan("estimate", "--gpu", "8xH100", "--depth", "4", "--steps", "10", "--out", str(plan)).returncode == 0
    r = nanoplan("run", str(plan), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    errors = [x for x in lines if x.startswith("error: preflight: ")]
    assert len(errors) == 2, r.stderr                       # no GPU, and no data dir: both, each on its line
    assert errors[0].startswith("error: preflight: the plan needs 8 CUDA GPUs on this node, and this machine has "
                                "none; run it on the planned machine, or plan for this one")
    assert "--data" in errors[1]
    assert "CUDA_VISIBLE_DEVICES" not in r.stderr and "more)" not in r.stderr
    assert lines[-1] == "hint: fix these 2, or pass --force to launch anyway"
    assert not (tmp_path / "run").exists()
