"""`nanoplan compare`: rows, highlights, csv/json/markdown that parse, the chart, and exit codes."""

import csv
import io
import json
import os
import stat
import subprocess
import sys

import pytest

from nanoplan.cli import main
from planner.candidates import Length, Settings, depth_ladder
from planner.compare import compare, pareto
from planner.profiles import parse_gpu_spec
from planner.selection import search
from planner.spec import nanochat, preset
from planner.units import fmt_count
from tests.errlines import error_and_hint

GPUS = ["8xH100", "H100", "8xA100-40GB", "2x8xH100"]


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["nanoplan", "compare", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_rows_match_per_config_search() -> None:
    cmp = compare(GPUS, depth_ladder(), Length(budget_usd=1000))
    assert [r.gpu for r in cmp.rows] == ["8xH100-SXM", "1xH100-SXM", "8xA100-40GB", "2x8xH100-SXM"]
    for r in cmp.rows:
        want = search(depth_ladder(), parse_gpu_spec(r.gpu), Length(budget_usd=1000)).best
        assert (r.best.spec, r.best.tokens, r.best.mem_bytes) == (want.spec, want.tokens, want.mem_bytes)
    assert sum(r.is_best for r in cmp.rows) == sum(r.is_cheapest for r in cmp.rows) == sum(r.is_fastest for r in cmp.rows) == 1
    best = next(r for r in cmp.rows if r.is_best)
    assert best.best.loss == min(r.best.loss for r in cmp.rows)
    assert (cmp.ref_model, cmp.ref_tokens) == (best.best.spec, best.best.tokens)
    # the reference job on each row: its fastest fitting settings for the reference model
    for r in cmp.rows:
        fast = search([cmp.ref_model], r.hw, Length(budget_usd=1000), objective="throughput").best
        launch = 60 + 120 + 30 * (r.hw.nodes > 1)     # start-up, compile warm-up, a 2-node rendezvous (s)
        assert r.ref_hours == pytest.approx((launch + cmp.ref_tokens / fast.tokens_per_sec) / 3600)
        assert r.ref_usd == pytest.approx(r.ref_hours * r.hw.num_gpus * r.hw.usd_per_gpu_hour)
    fastest = next(r for r in cmp.rows if r.is_fastest)
    cheapest = next(r for r in cmp.rows if r.is_cheapest)
    assert fastest.ref_hours == min(r.ref_hours for r in cmp.rows)
    assert cheapest.ref_usd == min(r.ref_usd for r in cmp.rows)
    assert fastest.gpu == "2x8xH100-SXM"   # 16 GPUs


def test_fixed_hours_and_nothing_fits_row() -> None:
    cmp = compare(["H100", "8xH100"], [preset("llama3.1-8b")], Length(hours=10))
    one, eight = cmp.rows
    assert one.best is None and "nothing fits" in one.note and one.ref_hours is None
    assert eight.best is not None and eight.best.hours == 10 and eight.is_best
    assert eight.best.usd == pytest.approx(10 * 8 * eight.hw.usd_per_gpu_hour)


def test_pareto_front() -> None:
    pts = [(1.0, 10.0), (2.0, 5.0), (3.0, 6.0), (4.0, 1.0), (1.5, 20.0)]
    assert pareto(pts) == [0, 1, 3]


def test_csv_parses(monkeypatch, capsys) -> None:
    code, out, err = run_main(monkeypatch, capsys, "--budget", "1000", "--gpus", ",".join(GPUS), "--format", "csv",
                              "--dataset-tokens", "3B")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["gpu"] for r in rows] == ["8xH100-SXM", "1xH100-SXM", "8xA100-40GB", "2x8xH100-SXM"]
    want = search(depth_ladder(), parse_gpu_spec("8xH100"), Length(budget_usd=1000),
                  Settings(dataset_tokens=3_000_000_000)).best
    r0 = rows[0]
    assert r0["model"] == want.name and int(r0["tokens"]) == want.tokens
    assert float(r0["epochs"]) == pytest.approx(want.tokens / 3e9, rel=1e-3)
    # 3B unique tokens: the search stops at 4 epochs (--max-epochs), well inside the $1000 budget.
    assert float(r0["epochs"]) <= 4.0 + 1e-9
    assert float(r0["usd"]) == pytest.approx(want.usd, rel=1e-3) and float(r0["usd"]) < 1000
    assert float(r0["usd_per_hour"]) == pytest.approx(31.6)
    assert sum(r["best"] == "True" for r in rows) == 1


def test_json_parses_fixed_depth(monkeypatch, capsys) -> None:
    code, out, err = run_main(monkeypatch, capsys, "--budget", "500", "--gpus", "8xH100,4xA100", "--depth", "20",
                              "--format", "json", "--provider", "lambda")
    assert code == 0, err
    data = json.loads(out)
    assert [d["model"] for d in data] == ["d20", "d20"]
    assert [d["provider"] for d in data] == ["lambda", "lambda"]
    assert data[0]["usd_per_hour"] == pytest.approx(8 * 2.99) and data[0]["n_params"] == 560_988_160
    assert data[0]["hours"] == pytest.approx(500 / (8 * 2.99), rel=1e-6)


def test_markdown_and_table(monkeypatch, capsys) -> None:
    code, out, _ = run_main(monkeypatch, capsys, "--budget", "1000", "--gpus", "8xH100,H100", "--format", "markdown")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("| ") and lines[1].startswith("|---") and len(lines) == 2 + 2 + 1
    assert all(line.count("|") == lines[0].count("|") for line in lines[:4])
    code, out, _ = run_main(monkeypatch, capsys, "--budget", "1000", "--gpus", "8xH100,H100")
    best = search(depth_ladder(), parse_gpu_spec("8xH100"), Length(budget_usd=1000)).best
    assert code == 0 and "★" in out and f"{best.name} ({fmt_count(best.n_params)})" in out


def test_plot_writes_png(monkeypatch, capsys, tmp_path) -> None:
    png = tmp_path / "sub" / "chart.png"
    code, out, err = run_main(monkeypatch, capsys, "--budget", "1000", "--gpus", "8xH100,8xB200,H100",
                              "--depth", "20", "--plot", str(png))
    assert code == 0, err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not [p for p in png.parent.iterdir() if p.name != "chart.png"]   # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(png.stat().st_mode) == 0o666 & ~umask             # not mkstemp's 0600


def test_plot_without_matplotlib_exit_2(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = run_main(monkeypatch, capsys, "--budget", "100", "--gpus", "8xH100", "--depth", "8",
                            "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "needs matplotlib" in err and "not installed" in err and ".[plot]" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("args,field", [
    (["--budget", "100", "--gpus", "8xV100"], "--gpus"),
    (["--budget", "100", "--hours", "3"], "exactly one"),
    ([], "exactly one"),
    (["--budget", "-5"], "--budget"),
    (["--budget", "100", "--format", "xml"], "--format"),
    (["--budget", "100", "--objective", "cheap"], "--objective"),
    (["--budget", "100", "--depth", "0"], "--depth"),
    (["--budget", "100", "--depth", "12", "--preset", "d20"], "--preset"),
    (["--budget", "100", "--plot", "chart.svg"], "--plot"),
    (["--budget", "100", "--gpus", "8xH100,8xB200", "--provider", "nobody"], "--provider"),
    (["--budget", "100", "--dataset-tokens", "lots"], "--dataset-tokens"),
    (["--budget", "100", "--gpus", ""], "--gpus"),
])
def test_bad_input_exit_2(monkeypatch, capsys, args, field) -> None:
    code, _, err = run_main(monkeypatch, capsys, *args)
    line, hint = error_and_hint(err)
    assert code == 2 and field in line, err
    # compare has no --profile or --trainer (estimate's): its errors never name them
    for missing in ("--profile", "--trainer"):
        assert missing not in f"{line} {hint} ", err


def test_total_batch_not_divisible_is_a_row() -> None:
    cmp = compare(["3xH100", "8xH100"], [nanochat(12)], Length(budget_usd=100))
    assert cmp.rows[0].best is None and "not a multiple" in cmp.rows[0].note
    assert cmp.rows[1].best is not None and cmp.rows[1].is_best


def test_compare_does_not_import_torch() -> None:
    code = ("import sys\nfrom nanoplan.cli import main\nsys.argv=['nanoplan','compare','--budget','100','--format','json',"
            "'--gpus','8xH100,H100']\ntry:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "bad=[m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\nassert not bad, bad[:3]\n"
            "print('ok', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip().endswith("ok"), r.stderr[-2000:]
