"""nanoplan against public GPU training runs: predicted vs measured tokens/s, and the fit verdict vs the outcome.

Usage: python benchmarks/public_runs.py [--out benchmarks/results/public_runs.md] [--baseline] [--runs FILE]

For every row of benchmarks/public_runs/runs.yaml (89 public runs; benchmarks/public_runs/README.md) the row
adapter (benchmarks/public_runs/adapter.py) builds the planner's inputs, and the planner predicts the job's
tokens/s and gives its fit verdict (fits / tight / does not fit) from the allocated peak it predicts. Printed:
each row's predicted and measured tokens/s per GPU with the error (predicted / measured - 1), the verdict next
to the known outcome, then for each set (calibration, held-out) the median |error|, the worst row, and the
median |error| per GPU, per trainer and single- vs multi-node, and the number of wrong verdicts.

A wrong verdict: "does not fit" for a run that ran, or "fits" for one that ran out of memory.

--baseline predicts with the model as it was before issue 25 (flat MFU; no selective checkpointing or FP8) and,
with --out, writes its tables as the file's "Baseline" section; without --baseline, --out rewrites the current
section and keeps the Baseline section that is already in the file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.public_runs.adapter import Prediction, measured_memory_bytes, predict  # noqa: E402
from benchmarks.public_runs.schema import PublicRun, load_runs  # noqa: E402

BASELINE_MARK = "## Baseline"


def _fmt_k(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e3:,.1f}k" if x >= 1e4 else f"{x:,.0f}"


def row_lines(preds: list[Prediction]) -> list[list[str]]:
    out = []
    for p in preds:
        r = p.row
        g = r.total_gpus
        err = p.error
        out.append([r.id, r.split[:4], f"{r.nodes}x{r.gpus_per_node}x{r.gpu}",
                    _fmt_k(p.measured / g if p.measured else None), _fmt_k(p.tokens_per_s / g),
                    f"{err:+.1%}" if err is not None else "-", f"{p.mfu:.1%}", f"{p.allocated / 2**30:.1f}",
                    _mem(r), r.outcome, p.verdict,
                    "ok" if p.verdict_ok else "WRONG", "; ".join(p.inputs.notes)])
    return out


HEAD = ["row", "set", "GPUs", "measured/GPU", "predicted/GPU", "error", "pred MFU", "alloc GiB", "measured mem",
        "outcome", "verdict", "", "notes"]
LEFT = {0, 1, 2, 9, 10, 11, 12}


def _mem(r: PublicRun) -> str:
    b, kind = measured_memory_bytes(r)
    if b is None:
        return "-"
    short = {"max_memory_allocated": "alloc", "max_memory_reserved": "reserved", "nvidia-smi": "smi"}[kind or ""]
    return f"{b / 2**30:.1f} {short}"


def _median_abs(xs: Iterable[float]) -> float:
    return statistics.median(abs(x) for x in xs)


def groups(preds: list[Prediction]) -> dict[str, Callable[[Prediction], str]]:
    return {"GPU": lambda p: p.row.gpu, "trainer": lambda p: p.row.trainer,
            "nodes": lambda p: "multi-node" if p.row.multi_node else "single node"}


def _speed_compiled(p: Prediction) -> bool:
    return bool(p.inputs.cfg.compile)


def bias_lines(sped: list[Prediction]) -> list[str]:
    """Issue 29's bias checks: median signed error of compiled and of eager H100 rows, and nanochat's rows as
    `--trainer nanochat` plans."""
    out = []
    for label, pick in (("H100 compiled", lambda p: p.row.gpu == "H100-SXM" and _speed_compiled(p)),
                        ("H100 eager", lambda p: p.row.gpu == "H100-SXM" and not _speed_compiled(p)),
                        ("nanochat (--trainer nanochat)", lambda p: p.row.trainer == "nanochat")):
        errs = [p.error for p in sped if pick(p)]
        if errs:
            out.append(f"  {label}: median error {statistics.median(errs):+.1%}, worst {max(errs, key=abs):+.1%} "  # type: ignore[arg-type]
                       f"(n={len(errs)})")
    return out


def coverage(sped: list[Prediction]) -> tuple[int, int, int]:
    """(rows whose P10–P90 band holds the measured tokens/s, rows with a band, rows without one). Each row's band is
    built from every other row's error in planner/speed_errors.py, never its own, and a row is judged by its error
    there (a calibration row's cross-validated one: no constant it was fitted to)."""
    import math  # noqa: PLC0415

    from planner.uncertainty import RUNS, band_for, kind_of  # noqa: PLC0415

    unseen = {r.id: r.log_error for r in RUNS}
    inside = total = none = 0
    for p in sped:
        trainer = p.inputs.trainer.name if p.inputs.trainer is not None else p.row.trainer
        band = band_for(kind_of(p.row.gpu, trainer, _speed_compiled(p), p.row.nodes),
                        [r for r in RUNS if r.id != p.row.id])
        if band is None:
            none += 1
            continue
        total += 1
        e = unseen.get(p.row.id)
        ratio = math.exp(-e) if e is not None else 1.0 / (1.0 + p.error)  # type: ignore[operator]
        inside += band.lo <= ratio <= band.hi
    return inside, total, none


def coverage_line(sped: list[Prediction]) -> str:
    inside, total, none = coverage(sped)
    share = f"{inside / total:.0%}" if total else "-"
    return (f"P10-P90 bands (each row's own error left out): hold the measured tokens/s for {inside} of {total} rows "
            f"({share}); {none} rows on GPUs with too few comparable runs get no band")


def _unproven(gpu: str) -> bool:
    """The GPU's speed is marked unproven (its profile's public check is off by more than SPEED_CHECK_TOL)."""
    from planner.profiles import find_profile, speed_off  # noqa: PLC0415

    return speed_off(find_profile(gpu)) is not None


def targets_lines(preds: list[Prediction]) -> list[str]:
    """Issue 29's Done-when bars, each with what this run measures and whether it is met."""
    sped = [p for p in preds if p.error is not None]
    held = [p for p in sped if p.row.split == "heldout"]
    cal = [p for p in sped if p.row.split == "calibration"]
    ok = lambda b: "met" if b else "NOT MET"  # noqa: E731
    med = lambda ps: statistics.median(p.error for p in ps) if ps else 0.0  # type: ignore[misc]  # noqa: E731

    def pick(ps: list[Prediction], f: Callable[[Prediction], bool]) -> list[Prediction]:
        return [p for p in ps if f(p)]

    m = _median_abs(p.error for p in held)  # type: ignore[misc]
    out = ["issue 29's bars:", f"  held-out median |error| <= 5%: {m:.1%} ({ok(m <= 0.05)})"]
    proven = [p for p in sped if not _unproven(p.row.gpu)]
    worst = max(proven, key=lambda p: abs(p.error or 0))
    over = [p for p in proven if abs(p.error or 0) > 0.20]
    out.append(f"  no row worse than 20% (GPUs not marked speed-unproven): worst {worst.error:+.1%} {worst.row.id} "
               f"({ok(not over)}{': ' + ', '.join(p.row.id for p in over) if over else ''})")
    for label, f in (("H100 compiled", lambda p: p.row.gpu == "H100-SXM" and _speed_compiled(p)),
                     ("H100 eager", lambda p: p.row.gpu == "H100-SXM" and not _speed_compiled(p))):
        h, c = med(pick(held, f)), med(pick(cal, f))
        out.append(f"  {label} median error within +-5%: held-out {h:+.1%} ({ok(abs(h) <= 0.05)}), calibration "
                   f"{c:+.1%} ({ok(abs(c) <= 0.05)})")
    nc = lambda p: p.row.trainer == "nanochat"  # noqa: E731
    h, c = med(pick(held, nc)), med(pick(cal, nc))
    out.append(f"  nanochat rows within 10% (--trainer nanochat): held-out median {h:+.1%} ({ok(abs(h) <= 0.10)}), "
               f"calibration {c:+.1%} ({ok(abs(c) <= 0.10)})")
    i, t, _ = coverage(held)
    out.append(f"  P10-P90 bands hold 75-85% of held-out rows: {i} of {t} ({i / t:.0%}, {ok(0.75 <= i / t <= 0.85)})")
    wrong = sum(1 for p in preds if not p.verdict_ok)
    out.append(f"  0 wrong fit verdicts: {wrong} ({ok(wrong == 0)})")
    return out


def summary(preds: list[Prediction], name: str, list_wrong: bool = True) -> list[str]:
    sped = [p for p in preds if p.error is not None]
    lines = [f"{name}: {len(preds)} rows, {len(sped)} with a measured speed"]
    if sped:
        worst = max(sped, key=lambda p: abs(p.error or 0))
        lines.append(f"  tokens/s: median |error| {_median_abs(p.error for p in sped):.1%}, "  # type: ignore[misc]
                     f"mean error {statistics.mean(p.error for p in sped):+.1%}, "   # type: ignore[misc]
                     f"worst {worst.error:+.1%} ({worst.row.id}); "
                     f"{sum(1 for p in sped if abs(p.error or 0) <= 0.10)} of {len(sped)} within 10%")
        for gname, key in groups(preds).items():
            by: dict[str, list[float]] = {}
            for p in sped:
                by.setdefault(key(p), []).append(p.error)  # type: ignore[arg-type]
            parts = [f"{k} {_median_abs(v):.1%} (n={len(v)})" for k, v in sorted(by.items())]
            lines.append(f"  by {gname}: " + ", ".join(parts))
        lines += bias_lines(sped)
        lines.append("  " + coverage_line(sped))
    known = len(preds)
    wrong = [p for p in preds if not p.verdict_ok]
    verdicts = {v: sum(1 for p in preds if p.verdict == v) for v in ("fits", "tight", "does not fit")}
    oom = [p for p in preds if p.row.outcome == "oom"]
    lines.append(f"  fit verdicts: {len(wrong)} wrong of {known} known outcomes "
                 f"({verdicts['fits']} fits, {verdicts['tight']} tight, {verdicts['does not fit']} does not fit; "
                 f"out-of-memory rows: " + ", ".join(f"{p.row.id} -> {p.verdict}" for p in oom) + ")")
    for p in wrong if list_wrong else []:
        lines.append(f"    WRONG: {p.row.id} ({p.row.outcome}) -> {p.verdict}: {p.verdict_detail}")
    return lines


def table_text(rows: list[list[str]], head: list[str]) -> str:
    w = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i in LEFT else c.rjust(w[i])  # noqa: E731
                              for i, c in enumerate(r)).rstrip()
    return "\n".join([fmt(head), fmt(["-" * x for x in w]), *map(fmt, rows)])


def table_md(rows: list[list[str]], head: list[str]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def run(runs_file: str | None, baseline: bool) -> tuple[list[Prediction], str, str]:
    runs = load_runs(runs_file)
    preds = [predict(r, baseline=baseline) for r in runs]
    preds.sort(key=lambda p: (p.row.split != "heldout", p.row.gpu, p.row.id))
    rows = row_lines(preds)
    summ: list[str] = []
    for split, name in (("calibration", "calibration set"), ("heldout", "held-out set")):
        summ += summary([p for p in preds if p.row.split == split], name)
    summ += summary(preds, "all rows", list_wrong=False)
    if not baseline:
        summ += targets_lines(preds)
    return preds, table_text(rows, HEAD) + "\n\n" + "\n".join(summ), table_md(rows, HEAD) + "\n\n```\n" + \
        "\n".join(summ) + "\n```\n"


def write_md(path: Path, body: str, baseline: bool, today: str, n_rows: int = 0) -> None:
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    kept_base = old[old.index(BASELINE_MARK):] if BASELINE_MARK in old else ""
    kept_cur = old[:old.index(BASELINE_MARK)] if BASELINE_MARK in old else old
    cmd = "python benchmarks/public_runs.py" + (" --baseline" if baseline else "")
    section = (f"`{cmd} --out {path}`, {today}. Tokens/s per GPU; error = predicted / measured - 1. "
               "A wrong verdict is 'does not fit' for a run that ran or 'fits' for one that ran out of memory.\n\n"
               + body)
    if baseline:
        kept_base = (f"{BASELINE_MARK}: the model before issue 25 (flat MFU, fit rule with 5% headroom)\n\n"
                     + section)
        cur = kept_cur or "# nanoplan against public GPU runs\n\n(no current section yet)\n\n"
    else:
        cur = (f"# nanoplan against public GPU runs\n\nPredicted against measured for the {n_rows} public runs of "
               "benchmarks/public_runs/runs.yaml (sources in benchmarks/public_runs/README.md). The split into "
               "calibration and held-out rows is fixed in the data file (issue 25's rows by hand, later rows by "
               "SHA-256 of their id, benchmarks/public_runs/split.py); fitted constants use calibration rows only. "
               "Tensor-parallel rows are planned with --tp (notes column). The P10-P90 lines check planner/uncertainty.py's bands, each row's band built without "
               "its own error.\n\n## Current model\n\n" + section + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cur + kept_base, encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the tables as markdown to this file")
    ap.add_argument("--baseline", action="store_true", help="predict with the model before issue 25")
    ap.add_argument("--runs", default=None, help="runs.yaml to read (default: benchmarks/public_runs/runs.yaml)")
    a = ap.parse_args(argv)
    _, text, md = run(a.runs, a.baseline)
    print(text)
    if a.out:
        write_md(a.out, md, a.baseline, dt.date.today().isoformat(), n_rows=len(load_runs(a.runs)))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
