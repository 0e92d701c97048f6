"""Smaller things (issue 28, item 6): a batch as people write it (1M, 512Ki, in sequences) and a refusal that
names it, probe's answer on one 80×24 screen with durations in words, --spot in 24 lines, one suggestion once,
the flag named, "1 GPU", validate --wide, run --nnodes 0, and docs that say what the code does."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from tests.conftest import REPO, make_tiny_plan
from tests.test_answers_agree import run_cli

BASE = ("estimate", "--gpu", "8xH100", "--depth", "4", "--steps", "10", "--json")


@pytest.mark.parametrize("args, tokens", [
    (("--total-batch-tokens", "1Mi"), 2**20), (("--total-batch-tokens", "512Ki"), 2**19),
    (("--total-batch-tokens", "262,144"), 2**18), (("--total-batch-seqs", "128"), 128 * 2048),
    (("--total-batch-seqs", "64", "--seq-len", "1024"), 64 * 1024),
])
def test_a_batch_takes_suffixes_and_sequences(monkeypatch, capsys, args, tokens) -> None:
    code, out, err = run_cli(monkeypatch, capsys, *BASE, *args)
    assert code == 0, err
    assert json.loads(out)["training"]["total_batch_tokens"] == tokens


def test_a_batch_that_cannot_be_read_or_split_says_so_in_nanoplans_words(monkeypatch, capsys) -> None:
    code, _, err = run_cli(monkeypatch, capsys, *BASE, "--total-batch-tokens", "1M")
    assert code == 2 and err.splitlines() == [
        "error: --total-batch-tokens: 1,000,000 is not a multiple of seq_len × GPUs = 16,384",
        "hint: use a multiple such as 999,424, or 1,048,576 (2^20)"]
    code, _, err = run_cli(monkeypatch, capsys, *BASE, "--total-batch-tokens", "lots")
    assert code == 2 and err.startswith("error: --total-batch-tokens: cannot read 'lots' as a count") and \
        "input should be" not in err
    code, _, err = run_cli(monkeypatch, capsys, *BASE, "--total-batch-seqs", "8", "--total-batch-tokens", "16k")
    assert code == 2 and err.startswith("error: --total-batch-seqs: conflicts with --total-batch-tokens")
    code, out, err = run_cli(monkeypatch, capsys, "compare", "--steps", "10", "--preset", "gpt2", "--gpus", "8xH100",
                             "--total-batch-seqs", "256", "--format", "json")
    assert code == 0 and json.loads(out)[0]["tokens"] == 10 * 256 * 1024, err


def test_a_cpu_run_too_short_for_the_default_batch_names_a_batch_that_trains(monkeypatch, capsys) -> None:
    for extra in ((), ("--depth", "4")):
        code, _, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "CPU", "--hours", "0.05", *extra,
                               "--out", "/dev/null")
        lines = err.splitlines()
        assert code == 2 and lines[0].startswith("error: --hours: 3.0 min leaves no time for one optimizer step of "
                                                 "524,288 tokens"), err
        m = re.search(r"--total-batch-tokens ([\d,]+) ", lines[1])
        assert m, err
        code, _, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "CPU", "--hours", "0.05", *extra,
                               "--total-batch-tokens", m.group(1), "--out", "/dev/null")
        assert code == 0, err                                         # the hint's batch trains


def _probe_result(tmp_path: Path):  # noqa: ANN202
    """A probe of the tiny plan with three trials, as runner.probe reports it (no trial is run)."""
    from planner.plan import load_plan
    from planner.probe import TrialConfig, corrected_length, measurement_of, replan, trial_plan
    from runner.probe import ProbeResult

    plan = load_plan(REPO / "examples" / "tiny" / "plan.json")
    trials = []
    for cfg, tps in ((TrialConfig("plan", 8, False), 25_547.0), (TrialConfig("smaller", 4, False), 21_000.0),
                     (TrialConfig("ckpt off", 8, True), 19_000.0)):
        tp = trial_plan(plan, cfg, 9)
        trials.append({"label": cfg.label, "role": cfg.role, "status": "ok", "seconds": 18.3,
                       "fits_with_headroom": True, "measured": {"tokens_per_sec": tps, "mfu": 0.053},
                       "predicted": {"tokens_per_sec": tp.throughput.tokens_per_sec,
                                     "memory_bytes": tp.memory.per_gpu_bytes}})
    chosen = trial_plan(plan, TrialConfig("plan", 8, False), 9)
    m = measurement_of(chosen, label="probe/b8", tokens_per_sec=25_547.0, steps=6, device="cpu", date="2026-11-27")
    new, _, note = replan(plan, chosen, m, 18.3, plan_path="plan.probed.json", today="2026-11-27")
    assert note == corrected_length(plan, 18.3)[1]
    report = {"trials": trials, "chosen": "b8", "reason": "b8: the plan's, and the fastest measured that fits",
              "cost": {"seconds": 18.3, "usd": 0.0}, "charged": note, "profile": "probe/profile.yaml"}
    return ProbeResult(report=report, plan=plan, corrected=new, out=Path("plan.probed.json"),
                       report_path=Path("probe/probe.json"))


def test_probe_fits_one_80x24_screen_with_durations_in_words(tmp_path) -> None:
    from nanoplan.probe import print_probe

    buf = io.StringIO()
    print_probe(_probe_result(tmp_path), Console(file=buf, width=80, force_terminal=False, color_system=None))
    text = buf.getvalue()
    lines = text.splitlines()
    assert len(lines) <= 24 and max(len(x) for x in lines) <= 80, text
    assert not re.search(r"\de[-+]\d", text), text                       # never 7.353e-05 h
    assert not re.search(r"\d\s*\n\s*(h|s|min)\b", text), text           # never a number wrapped from its unit
    assert "probe: 3 trials ($0.00), charged to the budget: 36 s − 18 s probe = 18 s left\n" in text
    assert "length" in text and " 36 s " in text and "next: nanoplan run plan.probed.json" in text


def test_spot_estimate_fits_24_lines_at_80_columns(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "8xH100", "--budget", "1000", "--spot",
                             "--out", "spot.json")
    lines = out.splitlines()
    # piped, the verdict is one line; on a terminal it wraps once: 24 with it
    assert code == 0 and len(lines) + 1 <= 24 and max(len(x) for x in lines[:-1]) <= 80, out
    assert sum("mean time between interruptions" in x or "MTBI" in x for x in lines) == 1   # said once


def test_one_suggestion_once_the_flag_named_and_one_gpu(monkeypatch, capsys) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "8xA100-40", "--budget", "10")
    assert code == 2 and "did you mean 8xA100-40GB?" in err and "8xA100-40GB or 8xA100-40GB" not in err
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--preset", "nope", "--budget", "10")
    assert code == 2 and err.startswith("error: --preset: unknown preset 'nope'")
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", "--gpu", "H100", "--depth", "4", "--steps", "10",
                           "--explain", "--out", "/dev/null", columns=200)
    assert code == 0 and "1 GPUs" not in out and "× 1 GPU × grad accum" in out and "(1 GPU, 1 node)" in out


def test_validate_wide_shows_every_column(monkeypatch, capsys, tmp_path) -> None:
    plan = make_tiny_plan(tmp_path / "plan.json", None, steps=5)
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(plan), columns=40)
    assert code == 0 and "(--wide shows all)" in " ".join(out.split()) and "analytic  " not in out
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(plan), "--wide", columns=40)
    assert code == 0 and "analytic  " in out and "capacity" in out and "Hidden" not in out


@pytest.mark.parametrize("args, says", [(("--nnodes", "0"), "error: --nnodes: must be at least 1, got 0"),
                                         (("--node-rank", "-1"), "error: --node-rank: must be at least 0, got -1")])
def test_run_refuses_zero_nodes(monkeypatch, capsys, tmp_path, args, says) -> None:
    plan = make_tiny_plan(tmp_path / "plan.json", None, steps=5)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(plan), "--dry-run", *args)
    assert code == 2 and err.splitlines()[0] == says


def test_hardware_md_table_is_the_profiles() -> None:
    """docs/hardware.md's 'All profiles' table says what each built-in profile holds (its CPU row said 0.075
    TFLOP/s and MFU 0.30 while CPU.yaml says 0.42 and 0.25)."""
    from planner.profiles import builtin_profiles

    text = (REPO / "docs" / "hardware.md").read_text()
    table = text[text.index("| profile | memory | usable |"):].split("\n\n")[0].splitlines()[2:]
    rows = {c[0]: c for c in ([x.strip() for x in r.strip("|").split("|")] for r in table)}
    profs = builtin_profiles()
    assert set(rows) == set(profs)
    for name, p in profs.items():
        d = p.price()
        assert rows[name] == [name, f"{p.memory_gb:g} GB", f"{p.usable_bytes / 2**30:.1f} GiB", f"{p.hbm_tb_s:g} TB/s",
                              f"{p.bf16_tflops:g} TFLOP/s", f"{p.intra_node_gb_s:g} / {p.inter_node_gb_s:g} GB/s",
                              str(p.gpus_per_node), f"{p.default_mfu:.2f}",
                              f"${d.usd_per_gpu_hour:g}/GPU-h, {d.provider} ({d.date})"], name


def test_docs_say_the_default_headroom_and_that_a_length_may_be_left_out() -> None:
    from planner.fit_verdict import DEFAULT_HEADROOM

    trainers = " ".join((REPO / "docs" / "trainers.md").read_text().split())
    assert DEFAULT_HEADROOM == 0 and "keeps no extra memory free by default (`--headroom 0`)" in trainers
    assert "keeps 5% of the GPU free by default" not in trainers
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "Exactly one of `--budget USD`" not in readme and "At most one of `--budget USD`" in readme


def test_fit_table_knows_its_natural_width_so_printing_need_not_measure_it() -> None:
    """print_table trusts fit_table's width (start-up: no rich measurement pass); it must equal rich's."""
    import random

    from planner.tables import Col, fit_table, natural_width

    rnd = random.Random(28)
    cells = ["1.2B", "$1,000", "★", "d20 (561M)", "[bold]x[/]", "12,345,678", "", "8×H100-SXM"]
    for _ in range(200):
        cols = [Col(f"c{i}" * rnd.randint(1, 3), rnd.randint(0, 3), rnd.choice(["left", "right"]))
                for i in range(rnd.randint(1, 8))]
        rows = [[rnd.choice(cells) * rnd.randint(1, 2) for _ in cols] for _ in range(rnd.randint(1, 5))]
        for width in (None, 40, 80):
            t = fit_table(cols, rows, width, title="a title that is long enough to wrap " * 3, caption="note")
            assert t.nanoplan_width == natural_width(t)


def test_the_profile_index_read_from_name_and_alias_lines_is_the_parsed_profiles() -> None:
    """find_profile parses one shipped profile, found by its `name:`/`aliases:` lines (start-up): those lines
    must say what the parsed YAML says, for every profile."""
    from planner.profiles import _shipped, builtin_profiles, find_profile

    profs = builtin_profiles()
    assert list(_shipped()) == list(profs)
    for name, (_, _, aliases) in _shipped().items():
        assert aliases == tuple(profs[name].aliases), name
        for spelling in (name, *aliases):
            assert find_profile(spelling) is profs[name]


def test_probe_on_another_trainers_plan_points_to_run(capsys, tmp_path) -> None:
    """Issue 28: `probe` on a nanochat plan said "needs 8 CUDA GPUs"; it times nanoplan's own step, so it says so
    in one line and points to `nanoplan run`, which supervises nanochat and measures its step (exit 2)."""
    from tests.conftest import nanoplan_cli

    code, _, err = nanoplan_cli(["estimate", "--trainer", "nanochat", "--depth", "12", "--gpu", "8xH100", "--budget",
                                 "100", "--out", "nc.json"], capsys, tmp_path)
    assert code == 0, err
    code, out, err = nanoplan_cli(["probe", "nc.json", "--dir", "probe"], capsys, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and lines[0] == ("error: nc.json: plans nanochat's training step; the probe measures nanoplan's "
                                      "own runner"), err
    assert lines[1].startswith("hint: run it with nanoplan run nc.json") and len(lines) == 2
    assert not (tmp_path / "probe").exists()
