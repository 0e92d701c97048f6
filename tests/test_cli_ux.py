"""The CLI read in a normal terminal: help at 80 columns, units as typed, errors, the verdict line,
tables that fit, the chart, and every hardware profile."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nanoplan.cli import app
from planner.build import build_plan
from planner.errors import PlanError
from planner.plan import PlanRequest, load_plan
from planner.profiles import SOURCED_FIELDS, builtin_profiles, parse_gpu_spec, split_gpu_spec
from planner.spec import nanochat
from planner.units import parse_hours, parse_money, parse_price
from tests.conftest import REPO
from tests.errlines import error_and_hint

COMMANDS = ["estimate", "compare", "validate", "run", "probe", "calibrate", "prepare-data", "export", "export-model",
            "profiles", "schema"]


def nanoplan(*args: str, columns: int = 80, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "24"}
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd or REPO)


# ---------------------------------------------------------------- help

def _long_options(command: str) -> list[str]:
    from typer.main import get_command

    group = get_command(app)
    cmd = group.get_command(None, command)  # type: ignore[arg-type]  (the lazy group needs no context)
    return [o for p in cmd.params if not getattr(p, "hidden", False)
            for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_cuts_no_option_and_has_examples(command: str) -> None:
    r = nanoplan(command, "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out, out                                   # nothing cut
    assert "<bool>" not in out                                   # flags take no value: the help says none
    for opt in _long_options(command):
        assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", out), (command, opt)
    examples = out.split("Examples", 1)[1] if "Examples" in out else ""
    n = sum(1 for line in examples.splitlines() if line.strip().startswith("nanoplan "))
    assert 2 <= n <= 4, (command, n)


def test_estimate_help_groups_options_into_panels() -> None:
    out = nanoplan("estimate", "--help").stdout
    for panel in ("Length and data", "Model", "Batch and memory", "Hardware and price", "Search", "Output"):
        assert f"─ {panel} ─" in out, panel


def test_flag_given_a_value_says_flags_take_none(tmp_path: Path) -> None:
    r = nanoplan("run", str(tmp_path / "plan.json"), "--dry-run", "true")
    line, hint = error_and_hint(r.stderr)
    assert r.returncode == 2 and "'true'" in line and "take no value" in hint


# ---------------------------------------------------------------- units as people type them

@pytest.mark.parametrize("text,value", [("1000", 1000), ("1,000", 1000), ("1k", 1000), ("$1000", 1000),
                                        ("$1.5k", 1500), ("2.5M", 2.5e6), ("1000 USD", 1000), ("12,345.5", 12345.5)])
def test_money_as_typed(text: str, value: float) -> None:
    assert parse_money(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["000", "00", "0,000", ""])
def test_money_the_shell_cut_is_named(text: str) -> None:
    with pytest.raises(PlanError) as e:
        parse_money(text)
    assert "shell" in e.value.problem and "quote it" in e.value.fix


@pytest.mark.parametrize("text", ["1,00", "abc", "-5", "1e", "$"])
def test_money_nonsense_is_refused(text: str) -> None:
    with pytest.raises(PlanError, match="--budget"):
        parse_money(text)


def test_prices_and_hours_as_typed() -> None:
    assert parse_price("3.95") == (3.95, "gpu") and parse_price("$3.95/h") == (3.95, "gpu")
    assert parse_price("3.95/gpu/h") == (3.95, "gpu") and parse_price("24/h/node") == (24.0, "node")
    assert parse_price("24/node-hour") == (24.0, "node") and parse_price("0") == (0.0, "gpu")
    with pytest.raises(PlanError, match="unknown unit"):
        parse_price("3/day")
    assert parse_hours("1.5h") == 1.5 and parse_hours("90m") == 1.5 and parse_hours("2d") == 48
    with pytest.raises(PlanError, match="--hours"):
        parse_hours("soon")


def test_budget_as_typed_on_the_command_line(tmp_path: Path) -> None:
    for typed in ("1k", "1,000", "$1000"):
        r = nanoplan("estimate", "--depth", "12", "--budget", typed, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["request"]["budget_usd"] == 1000
    r = nanoplan("estimate", "--depth", "12", "--budget", "000")      # what bash makes of --budget $1000
    line, hint = error_and_hint(r.stderr)
    assert r.returncode == 2 and "--budget" in line and "shell" in line and "'$1000'" in hint


def test_price_per_node() -> None:
    per_gpu = json.loads(nanoplan("estimate", "--depth", "12", "--hours", "1", "--price", "3", "--json").stdout)
    for args in (["--price", "24/h/node"], ["--price-per-node", "24"]):
        r = nanoplan("estimate", "--depth", "12", "--hours", "1", *args, "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["hardware"]["usd_per_gpu_hour"] == pytest.approx(3.0)
        assert d["budget"]["usd"] == pytest.approx(per_gpu["budget"]["usd"])
    r = nanoplan("estimate", "--depth", "12", "--hours", "1", "--price", "3", "--price-per-node", "24")
    assert r.returncode == 2 and "--price-per-node" in error_and_hint(r.stderr)[0]


@pytest.mark.parametrize("spec", ["8xH100", "h100x8", "8x H100", "8 × H100", "8 H100", "H100 x 8", "8*H100"])
def test_gpu_specs_as_typed(spec: str) -> None:
    hw = parse_gpu_spec(spec)
    assert (hw.spec, hw.num_gpus) == ("8xH100-SXM", 8)


def test_gpu_specs_with_nodes_and_spaces() -> None:
    assert split_gpu_spec("2x8xH100") == (2, 8, "H100")
    assert parse_gpu_spec("RTX 4090 x 4").spec == "4xRTX-4090" and parse_gpu_spec("8x RTX4090").spec == "8xRTX-4090"


@pytest.mark.parametrize("spec,guess", [("8xH10", "8xH100"), ("h10x8", "8xH100"), ("2x8xB20", "2x8xB200"),
                                        ("4xL40", "4xL40S")])
def test_unknown_gpu_did_you_mean(spec: str, guess: str) -> None:
    with pytest.raises(PlanError) as e:
        parse_gpu_spec(spec)
    assert e.value.field == "--gpu" and f"did you mean {guess}" in e.value.fix


# ---------------------------------------------------------------- one error style

def test_plan_error_renders_error_and_hint_lines() -> None:
    assert PlanError("--x", "is bad", "use y").lines() == ["error: --x: is bad", "hint: use y"]
    assert PlanError("--x", "is bad").lines() == ["error: --x: is bad"]


def test_usage_errors_in_the_same_style() -> None:
    r = nanoplan("compare", "--budget", "100", "--gpuss", "8xH100")
    line, hint = error_and_hint(r.stderr)
    assert r.returncode == 2 and line.startswith("error: --gpuss: no such option") and "--gpus?" in hint
    r = nanoplan("estimat")
    line, hint = error_and_hint(r.stderr)
    assert r.returncode == 2 and "nanoplan estimate" in hint
    r = nanoplan("estimate", "--top", "many")
    assert r.returncode == 2 and error_and_hint(r.stderr)[0].startswith("error: --top:")


def test_compare_errors_name_only_its_own_options() -> None:
    for args in (["--budget", "100", "--gpus", "8xV100"], ["--gpus", "8xH100"], ["--budget", "1", "--hours", "1"]):
        r = nanoplan("compare", *args)
        line, hint = error_and_hint(r.stderr)
        text = f" {line} {hint} "
        assert r.returncode == 2 and "--profile" not in text and "--trainer" not in text, text   # estimate's only


# ---------------------------------------------------------------- estimate: the plan file and the verdict

def test_estimate_writes_plan_json_by_default_and_ends_with_the_verdict(tmp_path: Path) -> None:
    r = nanoplan("estimate", "--budget", "100", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = load_plan(tmp_path / "plan.json")
    text = " ".join(r.stdout.split())                    # the verdict may wrap at 80 columns
    verdict = text[text.rindex("→ " + plan.model.name + ","):]
    assert verdict.endswith("→ plan.json"), verdict     # printed last
    assert f"${plan.hardware.usd_per_gpu_hour:,.2f}/GPU-h" in verdict and "8×H100-SXM" in verdict
    assert "--plan plan.json" in " ".join(plan.launch.command)        # the launch line is true
    sub = tmp_path / "sub"
    sub.mkdir()
    r = nanoplan("estimate", "--budget", "100", "--json", cwd=sub)
    assert r.returncode == 0 and json.loads(r.stdout)["model"]["name"] == plan.model.name
    assert not (sub / "plan.json").exists()                           # --json: stdout only


def test_pinned_model_that_does_not_fit_exits_1_with_the_plan(tmp_path: Path) -> None:
    out = tmp_path / "big.json"
    r = nanoplan("estimate", "--gpu", "H100", "--depth", "48", "--hours", "1", "--strategy", "ddp", "--no-activation-checkpointing",
                 "--no-activation-checkpointing", "--out", str(out))
    assert r.returncode == 1, r.stderr
    plan = load_plan(out)
    assert plan.memory.fits is False
    text = " ".join(r.stdout.split())
    assert text[text.rindex("✗ d48"):].endswith(f"→ {out} (fits: false)")
    v = subprocess.run([sys.executable, "-m", "nanoplan", "validate", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert v.returncode == 1


def test_one_micro_batch_tried_is_not_any_micro_batch(tmp_path: Path) -> None:
    r = nanoplan("estimate", "--gpu", "8xH100", "--depth", "48", "--hours", "1", "--strategy", "ddp",
                 "--device-batch-size", "1", "--explain", "--out", str(tmp_path / "p.json"), columns=200)
    assert r.returncode == 1
    assert "at any micro-batch" not in r.stdout and "the only one tried" in r.stdout


# ---------------------------------------------------------------- tables that fit the terminal

def _table_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.strip()]


def test_compare_at_80_columns_shows_the_key_columns_uncut() -> None:
    r = nanoplan("compare", "--budget", "1000", columns=80)
    assert r.returncode == 0, r.stderr
    lines = _table_lines(r.stdout)
    assert max(len(x) for x in lines) <= 80 and "…" not in r.stdout
    header = next(x for x in lines if "GPUs" in x)
    for col in ("GPUs", "model", "tokens", "hours", "cost", "loss"):
        assert col in header.split(), header
    row = next(x for x in lines if "8xH100-SXM" in x)
    assert re.search(r"d\d+ \(\d[\d.]*[MB]\)\s+\d[\d.]*B\s+\d+\.\d\s+\$\d{1,3}(,\d{3})*\s+\d\.\d{3}", row), row
    assert "--wide" in r.stdout


def test_compare_wider_terminal_and_wide_show_more() -> None:
    narrow = nanoplan("compare", "--budget", "1000", "--gpus", "8xH100,8xL40S", columns=80).stdout
    wide = nanoplan("compare", "--budget", "1000", "--gpus", "8xH100,8xL40S", columns=120).stdout
    full = nanoplan("compare", "--budget", "1000", "--gpus", "8xH100,8xL40S", "--wide", columns=80).stdout
    head = next(x for x in narrow.splitlines() if "GPUs" in x)
    assert "tokens/s" not in head and "ref $" in wide and "…" not in wide
    assert max(len(x) for x in _table_lines(wide)) <= 120
    for col in ("VRAM/GPU", "GPU spec", "micro×acc", "tokens/s", "ref h"):
        assert col in full, col


def test_runners_up_give_each_row_its_hours_and_cost(tmp_path: Path) -> None:
    r = nanoplan("estimate", "--budget", "100", "--dataset-tokens", "3B", "--out", str(tmp_path / "p.json"), columns=80)
    assert r.returncode == 0, r.stderr
    head = next(x for x in r.stdout.splitlines() if x.startswith("#"))
    assert "hours" in head.split() and "cost" in head.split()
    assert not re.search(r"each [\d.]+ (h|min) for \$", r.stdout)     # no shared hours and cost in the title
    rows = [x for x in r.stdout.splitlines() if re.match(r"^(★|\d) ", x)]
    assert len(rows) >= 3 and all(re.search(r"\$\d", x) for x in rows)
    table = r.stdout.split("\nmodel ")[0]              # the table, before the summary
    assert max(len(x) for x in table.splitlines()) <= 80
    assert r.stdout.rstrip().splitlines()[-1].startswith("→ ")   # the verdict: one line, last, never hard-wrapped


# ---------------------------------------------------------------- the chart

@pytest.mark.parametrize("provider", ["modal", "runpod", "lambda"])
def test_chart_labels_do_not_overlap_and_the_legend_is_honest(provider: str) -> None:
    from nanoplan.compare_plot import figure
    from planner.candidates import Length, depth_ladder
    from planner.compare import compare

    cmp = compare(["8xB200", "8xH200", "8xH100", "8xA100", "4xH100", "4xA100", "H100", "2x8xH100"], depth_ladder(),
                  Length(budget_usd=1000), provider=provider)
    fig = figure(cmp)
    try:
        ax = fig.axes[0]
        r = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(r) for t in ax.texts]
        assert len(boxes) == sum(x.ref_hours is not None for x in cmp.rows)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (ax.texts[boxes.index(a)].get_text(), ax.texts[boxes.index(b)].get_text())
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn = {h.get_label() for h in ax.get_lines() + ax.collections}
        assert all(x in drawn for x in legend), (legend, drawn)
        assert ("Pareto front: no configuration is both faster and cheaper" in legend) == any(
            "Pareto" in x.get_label() and len(x.get_xdata()) >= 2 for x in ax.get_lines())
        assert provider in ax.get_title()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


# ---------------------------------------------------------------- hardware

@pytest.mark.parametrize("name", sorted(builtin_profiles()))
def test_every_profile_loads_and_plans_d12(name: str) -> None:
    prof = builtin_profiles()[name]
    assert all(f in prof.sources and prof.sources[f].strip() for f in SOURCED_FIELDS)
    assert all(p.date and p.provider and p.source for p in prof.prices)
    cpu = prof.kind == "cpu"
    plan = build_plan(PlanRequest(gpu=f"1x{name}", profile=prof, model=nanochat(12), hours=10.0,
                                  precision="fp32" if cpu else "bf16-autocast", compile=not cpu))
    assert plan.model.name == "d12" and plan.schedule.total_steps >= 1 and plan.throughput.tokens_per_sec > 0


@pytest.mark.parametrize("name", ["L40S", "H100-NVL", "RTX-4090", "RTX-5090", "RTX-3090", "A10G", "L4"])
def test_new_pcie_and_consumer_profiles(name: str) -> None:
    p = builtin_profiles()[name]
    assert p.default_mfu == 0.30 and "assumption" in p.sources["default_mfu"]
    assert p.intra_node_gb_s <= 64            # PCIe figures: no NVLink between all the GPUs of a node
    assert re.match(r"^\d{4}(-\d{2})?(-\d{2})?$", p.price().date)


def test_out_to_a_device_discards_and_keeps_the_device(tmp_path: Path) -> None:
    """--out /dev/null must not replace the device with a file (writes are temp file + rename)."""
    import stat

    before = os.stat(os.devnull)
    assert stat.S_ISCHR(before.st_mode)
    r = nanoplan("estimate", "--depth", "12", "--hours", "1", "--out", os.devnull, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert not (tmp_path / "plan.json").exists()
    r = nanoplan("estimate", "--depth", "12", "--hours", "1", "--out", str(tmp_path))
    line, hint = error_and_hint(r.stderr)
    assert r.returncode == 2 and "is a directory" in line
