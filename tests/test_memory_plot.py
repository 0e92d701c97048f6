"""`estimate --plot memory.png`: the planner's per-phase breakdown (planner/step_phases.py) and the chart
(nanoplan/memory_plot.py): its numbers are the memory model's, its labels do not overlap, and matplotlib is
only imported when a chart is drawn."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest

from nanoplan.memory_plot import figure
from planner.build import build_plan
from planner.plan import PlanRequest
from planner.profiles import find_profile
from planner.spec import nanochat, preset
from planner.step_phases import PHASES, step_memory
from tests.conftest import REPO


def _plan(gpu: str = "8xH100", **kw):
    base = dict(gpu=gpu, profile=find_profile(gpu.split("x")[-1]), model=nanochat(12), steps=10)
    return build_plan(PlanRequest(**{**base, **kw}))


CASES = {
    "ddp eager": dict(compile=False),
    "ddp compiled b32": dict(device_batch_size=32),
    "zero1 accumulating": dict(strategy="zero1", device_batch_size=8),
    "zero2": dict(strategy="zero2", device_batch_size=16),
    "fsdp + checkpointing": dict(strategy="fsdp", activation_checkpointing=True, device_batch_size=32),
    "one GPU, muon": dict(gpu="H100", optimizer="muon", device_batch_size=8),
    "cpu fp32": dict(gpu="2xCPU", model=preset("tiny"), precision="fp32", compile=False, total_batch_tokens=1024),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_phase_adds_up_to_the_memory_model(case: str) -> None:
    plan = _plan(**CASES[case])
    sm = step_memory(plan)
    assert [p.phase for p in sm.phases] == [p for p, _ in PHASES]
    for p in sm.phases:                                    # the plan's own per-phase totals, to the byte
        assert p.allocated == plan.memory.phases[p.phase], (case, p.phase)
        assert all(v >= 0 for v in p.parts.values())
    peak = max(sm.phases, key=lambda p: p.allocated)
    assert peak.phase == plan.memory.peak_phase
    assert peak.parts == {k: plan.memory.breakdown.get(k, 0) for k in peak.parts}   # the peak's breakdown too
    assert sm.overhead == plan.memory.overhead
    assert sm.limit_bytes == int(plan.memory.usable_bytes * (1 - plan.memory.headroom))


def test_other_trainers_are_refused() -> None:
    from planner.errors import PlanError
    from planner.plan import TrainerRef

    plan = _plan(trainer=TrainerRef(name="nanochat"), model=nanochat(12))
    with pytest.raises(PlanError, match="nanoplan's runner step"):
        step_memory(plan)


def _labels(fig) -> list[tuple[str, object]]:
    """Every drawn text and its box in pixels (ticks beyond the axis limits lie outside the figure: not drawn)."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    w, h = fig.canvas.get_width_height()
    frame = Bbox.from_bounds(0, 0, w, h)
    out = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip():
            bb = t.get_window_extent(renderer)
            if bb.overlaps(frame):
                out.append((t.get_text(), bb))
    return out


@pytest.mark.parametrize("case", ["ddp compiled b32", "fsdp + checkpointing", "cpu fp32", "one GPU, muon"])
def test_no_label_overlaps_another_or_leaves_the_picture(case: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(step_memory(_plan(**CASES[case])).as_dict())
    try:
        labels = _labels(fig)
        assert len(labels) >= 20
        assert [(a, b) for (a, ba), (b, bb) in combinations(labels, 2) if ba.overlaps(bb)] == []
        w, h = fig.canvas.get_width_height()
        for text, bb in labels:
            assert bb.x0 >= 0 and bb.y0 >= 0 and bb.x1 <= w and bb.y1 <= h, text
    finally:
        plt.close(fig)


def _nanoplan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def test_estimate_plot_writes_the_png_and_keeps_the_verdict_last(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    r = _nanoplan("estimate", "--gpu", "8xH100", "--depth", "20", "--device-batch-size", "32", "--strategy", "ddp",
                  "--no-activation-checkpointing", "--no-compile", "--steps", "10", "--plot", "m/memory.png",
                  cwd=tmp_path)
    assert r.returncode == 1, r.stderr                      # d20 at b32 under eager ddp does not fit: the chart shows why
    assert "wrote m/memory.png" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("✗ d20")
    png = tmp_path / "m" / "memory.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert mpimg.imread(png).shape[:2] == (672, 1152)         # 9.6 × 5.6 in at 120 dpi
    for args, msg in ((("--plot", "m.jpg"), "not a .png path"), (("--trainer", "nanochat", "--plot", "m.png"),
                                                                 "runner step")):
        bad = _nanoplan("estimate", "--depth", "12", "--steps", "10", *args, cwd=tmp_path)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --plot: ") and msg in bad.stderr, bad.stderr


def test_matplotlib_is_imported_only_for_a_chart(tmp_path: Path) -> None:
    probe = ("import sys; from nanoplan.cli import main; sys.argv = ['nanoplan', 'estimate', '--depth', '12', "
             "'--steps', '10', '--out', 'p.json'] + sys.argv[1:]\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('MPL', 'matplotlib' in sys.modules, file=sys.stderr)")
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    drawn = subprocess.run([sys.executable, "-c", probe, "--plot", "m.png"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "MPL False" in plain.stderr and "MPL True" in drawn.stderr, (plain.stderr, drawn.stderr)
    tree = ast.parse((REPO / "nanoplan" / "memory_plot.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] in ("planner", "runner", "torch") for m in imported), imported


def test_the_committed_example_is_shown_and_made_by_the_documented_command() -> None:
    doc = (REPO / "docs" / "memory.md").read_text()
    assert "](memory_step.png)" in doc and "--plot docs/memory_step.png" in doc
    assert (REPO / "docs" / "memory_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
