"""`nanoplan sample RUN_DIR` (issue 28): continuations of a prompt from a run's checkpoint with the run's own
tokenizer, against an independent greedy decode of the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nanoplan.sample import printable
from planner.plan import load_plan
from runner.checkpoint_layout import complete_steps, step_dir
from runner.model import GPT
from tests.conftest import TEXT, make_tiny_plan, nanoplan_cli, torchrun, write_data_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(plan, run dir, data dir) of a real 40-step run on one CPU process, validated every 10 steps."""
    tmp = tmp_path_factory.mktemp("sample")
    data = write_data_dir(tmp / "data", TEXT.read_bytes())
    plan = make_tiny_plan(tmp / "plan.json", data, gpus=1, steps=40, hyper={"val_every_steps": 10, "lr": 1e-2},
                          checkpoint_every_minutes=0.0001, keep_last=3)
    res = torchrun(plan, tmp / "run", 1, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return plan, tmp / "run", data


def greedy(run_dir: Path, step: int, prompt: bytes, n: int) -> bytes:
    """The most likely next byte, n times, computed here from model.pt and the plan (no runner.sample)."""
    spec = load_plan(json.loads((run_dir / "run_info.json").read_text())["plan_path"]).request.model
    model = GPT(spec)
    model.load_state_dict(torch.load(step_dir(run_dir, step) / "model.pt", weights_only=True))
    model.eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids[-spec.seq_len:]]))[0, -1].argmax()))
    return bytes(ids)


def cli(capsys: pytest.CaptureFixture[str], cwd: Path, *args: str) -> tuple[int, str, str]:
    return nanoplan_cli(["sample", *args], capsys, cwd)


def test_greedy_sample_is_the_models_most_likely_text(run, capsys, tmp_path: Path) -> None:
    _, run_dir, _ = run
    last = complete_steps(run_dir)[-1]
    code, out, err = cli(capsys, tmp_path, str(run_dir), "--checkpoint", "last", "--prompt", "The ", "-n", "1",
                         "--tokens", "30", "--temperature", "0")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"the newest checkpoint: step {last}, val loss ") and "byte tokenizer" in lines[0]
    assert lines[1].startswith("──── sample 1 of 1")
    want = greedy(run_dir, last, b"The ", 30).decode("utf-8", "replace")
    assert "\n".join(lines[2:]) == printable(want).rstrip("\n")


def test_the_best_checkpoint_a_step_the_seed_and_the_count(run, capsys, tmp_path: Path) -> None:
    _, run_dir, _ = run
    best = json.loads((run_dir / "best.json").read_text())["step"]
    code, out, _ = cli(capsys, tmp_path, str(run_dir), "--prompt", "and", "-n", "2", "--tokens", "20")
    assert code == 0 and out.startswith(f"the best checkpoint: step {best}, val loss ")
    samples = out.split("──── sample ")[1:]
    assert len(samples) == 2 and all(s.split("\n", 1)[1].startswith("and") for s in samples)
    again = cli(capsys, tmp_path, str(run_dir), "--prompt", "and", "-n", "2", "--tokens", "20")[1]
    other = cli(capsys, tmp_path, str(run_dir), "--prompt", "and", "-n", "2", "--tokens", "20", "--seed", "7")[1]
    assert again == out and other != out                  # the same seed, the same text
    first = complete_steps(run_dir)[0]
    code, out, _ = cli(capsys, tmp_path, str(run_dir), "--checkpoint", str(first), "-n", "1", "--tokens", "5")
    assert code == 0 and out.startswith(f"checkpoint: step {first}")


@pytest.mark.parametrize(("args", "first"), [
    (("--checkpoint", "999999"), "error: --checkpoint: no complete checkpoint of step 999999 in "),
    (("--checkpoint", "newest"), "error: --checkpoint: 'newest' is not best, last or a step number"),
    (("--tokens", "0"), "error: --tokens: must be at least 1, got 0"),
    (("--temperature", "nan"), "error: --temperature: must be a finite number >= 0, got nan"),
])
def test_bad_options_are_one_line(run, capsys, tmp_path: Path, args: tuple[str, ...], first: str) -> None:
    code, out, err = cli(capsys, tmp_path, str(run[1]), *args)
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith(first) and all(x.startswith("hint: ") for x in lines[1:]), err
    assert "Traceback" not in err and len(lines) <= 2


def test_a_moved_data_dir_is_named_and_data_finds_it(run, capsys, tmp_path: Path) -> None:
    _, run_dir, data = run
    moved = tmp_path / "data"
    data.rename(moved)                                    # the data the run trained on is moved away
    try:
        code, _, err = cli(capsys, tmp_path, str(run_dir), "--tokens", "3")
        assert code == 2 and err.startswith(f"error: --data: the run's data directory {data} has no meta.json"), err
        code, out, err = cli(capsys, tmp_path, str(run_dir), "--tokens", "3", "--data", str(moved))
        assert code == 0 and "byte tokenizer" in out, err
    finally:
        moved.rename(data)


def test_control_characters_never_reach_the_terminal() -> None:
    assert printable("a\x1b[31mred\u202eb\tc\nd\x00é") == "a\\x1b[31mred\\u202eb\tc\nd\\x00é"
