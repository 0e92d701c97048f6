"""The docs check (scripts/render_docs.py): its parser, renderer, shape comparison and stray-file rule, and
the README tour's structure.

The commands themselves run in CI: `.ci/run` runs `python scripts/render_docs.py --check`, which re-runs every
console block of README.md and docs/*.md in a scratch copy and fails on a failed command, a changed output or
a file written where git does not ignore. (This file used to re-run the README's commands as a test as well;
that ran the tour's probe, run and calibrate twice per CI run.)
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_render_docs():
    spec = importlib.util.spec_from_file_location("render_docs", REPO / "scripts" / "render_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_docs"] = module
    spec.loader.exec_module(module)
    return module


rd = _load_render_docs()


def test_parser_reads_commands_outputs_and_directives() -> None:
    text = "\n".join([
        "# t", "",
        "```console", "$ echo a \\", "  b", "a b", "$ true", "```", "",
        "<!-- docs: skip, why=it installs things, slowly -->", "```bash", "pip install nothing", "```", "",
        "<!-- docs: columns=120, no-check, rc=2, why=slow -->", "", "```console", "$ false", "error: x", "```",
        "<!-- docs: shape -->", "```console", "$ date", "```",
        "```python", "print(1)", "```",
    ])
    _, blocks = rd.parse(text)
    assert [b.lang for b in blocks] == ["console", "bash", "console", "console", "python"]
    first, setup, wide, shaped, code = blocks
    assert [c.text for c in first.commands] == ["echo a \\\n  b", "true"]
    assert first.commands[0].output == ["a b"] and first.commands[1].output == []
    assert first.checked and first.columns == rd.DEFAULT_COLUMNS and first.mode == "exact"
    assert setup.skip and not setup.checked and setup.options["why"] == "it installs things, slowly"
    assert wide.columns == 120 and not wide.checked and not wide.skip
    assert wide.expected_rc(wide.commands[0]) == 2
    assert shaped.mode == "shape" and shaped.checked
    assert code.commands == []


@pytest.mark.parametrize("directive, message", [
    ("<!-- docs: skip -->", "says why"),
    ("<!-- docs: no-check -->", "says why"),
    ("<!-- docs: no-test -->", "unknown docs option 'no-test'"),
    ("<!-- docs: shape, timings -->", "one of shape or timings"),
])
def test_bad_directives_are_errors(directive: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rd.parse(f"{directive}\n```console\n$ true\n```")


def test_render_replaces_output_keeps_skipped_blocks_and_is_idempotent(tmp_path: Path) -> None:
    doc = "\n".join([
        "intro",
        "```console", "$ echo $COLUMNS; echo hello", "stale output", "```",
        "<!-- docs: columns=120 -->", "```console", "$ echo $COLUMNS", "```",
        "<!-- docs: skip, why=never -->", "```console", "$ echo never", "kept as written", "```",
        "```console", "$ nanoplan estimate --gpu 8xH100 --depth 12 --hours 1 --out x.json | tail -n 1", "```",
        "end",
    ])
    work = rd.scratch_copy(tmp_path / "copy")
    once, changed = rd.render_text(doc, work)
    assert "80\nhello" in once and "stale output" not in once
    assert "$ echo $COLUMNS\n120\n```" in once
    assert "$ echo never\nkept as written" in once
    assert "→ d12, 186M params" in once and "→ x.json" in once
    assert len(changed) == 3
    twice, changed_again = rd.render_text(once, work)
    assert twice == once and changed_again == []


def test_check_leaves_no_check_blocks_out_and_render_runs_them(tmp_path: Path) -> None:
    doc = "<!-- docs: no-check, why=slow -->\n```console\n$ echo ran\nold\n```"
    work = rd.scratch_copy(tmp_path / "copy")
    checked, changed = rd.render_text(doc, work, check=True)
    assert checked == doc and changed == []
    rendered, changed = rd.render_text(doc, work)
    assert "$ echo ran\nran\n```" in rendered and changed == ["echo ran"]


def test_a_broken_command_fails_the_render(tmp_path: Path) -> None:
    work = rd.scratch_copy(tmp_path / "copy")
    with pytest.raises(RuntimeError, match="exited 2"):
        rd.render_text("```console\n$ nanoplan estimate --gpu H999 --budget 10\n```", work)
    # A block that documents the error (its output shows an `error:` line) renders.
    text, _ = rd.render_text("```console\n$ nanoplan estimate --gpu H999 --budget 10\nerror: old\n```", work)
    assert "error: --gpu" in text


RUN_RECORDED = [
    "launching: /usr/bin/python3 -m torch.distributed.run --standalone --nnodes=1 \\",
    "  --plan tour/tiny.probed.json --run-dir tour/run",
    "step 1/30  loss 5.5611  19,846 tok/s (-47% vs plan)  mfu 10.4%  $0.00  0m04s elapsed  stop in -",
    "trial        status  tokens/s  vs plan    MFU  peak memory    time",
    "b8 plan      fits      30,163     -46%  15.8%  9.3 MiB model   7 s",
    "b4* smaller  fits      37,445     -33%  19.6%  6.2 MiB model   6 s",
    "  time        0.5 s        6.0 s",
    "─────────────────",
]
RUN_ELSEWHERE = [    # another machine: other digits, units, widths, wrapping, repeated progress, another winner
    "launching: /usr/bin/python3 -m torch.distributed.run",
    "  --standalone --nnodes=1 \\ --plan tour/tiny.probed.json --run-dir tour/run",
    "step 1/30  loss 5.5611  9,846 tok/s (-71% vs plan)  mfu 5.4%  $0.00  0m09s elapsed  stop in -",
    "step 17/30  loss 4.9000  29,846 tok/s (+3% vs plan)  mfu 12.4%  $0.00  0m14s elapsed  stop in -",
    "trial         status  tokens/s  vs plan    MFU  peak memory    time",
    "b8* plan      fits     130,163      +6%  45.8%  9.3 MiB model  12 s",
    "b4 smaller    fits     107,445     -13%  39.6%  6.2 MiB model  11 s",
    "  time        0.5 s        1.2 min",
    "──────────────────────",
]


def test_shape_ignores_digits_units_widths_wrapping_markers_and_repeats_but_not_words() -> None:
    assert rd.skeleton(RUN_RECORDED, "shape") == rd.skeleton(RUN_ELSEWHERE, "shape")
    for i, line in enumerate(RUN_ELSEWHERE):   # a changed or added word, a lost line: not the same shape
        for edit in (line.replace("plan", "plans"), line + " warning", None):
            if edit != line and (edit is not None or i not in (2, 3)):   # 2 and 3: one progress line, repeated
                other = [*RUN_ELSEWHERE[:i], *([edit] if edit is not None else []), *RUN_ELSEWHERE[i + 1:]]
                assert rd.skeleton(other, "shape") != rd.skeleton(RUN_RECORDED, "shape"), (i, edit)
    assert rd.skeleton(["18.0 MB/s, 30.7k tokens, 9.3 MiB"], "shape") == rd.skeleton(["1.2 GB/s, 2.1M tokens, 1 GiB"],
                                                                                     "shape")
    assert rd.skeleton(["d2, 131k params"], "shape") != rd.skeleton(["d2 131k params"], "shape")   # punctuation counts


def test_timings_ignore_only_durations_and_rates() -> None:
    recorded = ["13,728 candidates in 372 ms; 49.4 kB in 0.00 s (18.0 MB/s), 0m04s, 9,000 tok/s"]
    assert rd.skeleton(recorded, "timings") == rd.skeleton(
        ["13,728 candidates in 1.2 s; 49.4 kB in 0.12 s (1.0 MB/s), 1m04s, 19,000 tok/s"], "timings")
    assert rd.skeleton(recorded, "timings") != rd.skeleton(
        ["13,729 candidates in 372 ms; 49.4 kB in 0.00 s (18.0 MB/s), 0m04s, 9,000 tok/s"], "timings")


def test_check_compares_a_shape_block_by_shape_and_others_exactly(tmp_path: Path) -> None:
    work = rd.scratch_copy(tmp_path / "copy")
    for directive, stale, is_changed in (("<!-- docs: shape -->", "took 9.5 min", False),
                                         ("<!-- docs: shape -->", "lasted 12 s", True),
                                         ("", "took 12 s", True)):
        doc = f"{directive}\n```console\n$ echo took 3 s\n{stale}\n```"
        _, changed = rd.render_text(doc, work, check=True)
        assert (changed == ["echo took 3 s"]) == is_changed, (directive, stale)


def test_commands_may_write_only_where_git_ignores(tmp_path: Path) -> None:
    ok = tmp_path / "ok.md"
    ok.write_text("```console\n$ mkdir -p tour runs/x && touch tour/a.json runs/x/b plan.json && echo done\ndone\n```\n")
    rd.render_file(ok, check=True, log=lambda m: None)
    bad = tmp_path / "bad.md"
    bad.write_text("```console\n$ touch d12.json my_cpu.yaml && echo done\ndone\n```\n")
    with pytest.raises(RuntimeError, match="2 file.*git does not ignore: d12.json, my_cpu.yaml"):
        rd.render_file(bad, check=True, log=lambda m: None)
    assert not (REPO / "d12.json").exists()


# ---------------------------------------------------------------- the README tour

def _readme_blocks():
    return rd.parse((REPO / "README.md").read_text())[1]


def test_the_tour_is_checked_in_ci_and_keeps_its_steps() -> None:
    blocks = _readme_blocks()
    checked = [c for b in blocks if b.checked and b.lang == "console" for c in b.commands]
    assert len(checked) >= 10, "the README tour lost its commands"
    skipped = [c.text for b in blocks if not b.checked for c in b.commands]
    assert any(c.startswith("pip install") for c in skipped)
    shaped = {c.text.split()[1] for b in blocks if b.mode == "shape" for c in b.commands}
    assert {"probe", "run", "calibrate"} <= shaped, "machine-dependent blocks are compared for shape"
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^python scripts/render_docs\.py --check\b", ci, re.M), ".ci/run runs the docs check"


def _written_paths(command: str) -> list[str]:
    words = shlex.split(command.replace("\\\n", " "))
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--out", "--run-dir", "--dir")]


def test_the_tour_writes_only_ignored_paths() -> None:
    """Every --out, --run-dir and --dir of the tour lands where git ignores, and none is left to a default in
    the repository root (estimate's plan.json, probe's plan.probed.json and probe/)."""
    commands = [c.text for b in _readme_blocks() if b.checked and b.lang == "console" for c in b.commands]
    paths = [p for c in commands for p in _written_paths(c)]
    assert len(paths) >= 8
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, capture_output=True,
                             input="\n".join(p.rstrip("/") + "/x" for p in paths), text=True).stdout.split()
    assert sorted(ignored) == sorted(p.rstrip("/") + "/x" for p in paths)
    assert all(p.startswith("tour/") for p in paths), paths
    for c in commands:
        if c.startswith(("nanoplan estimate", "nanoplan probe")):
            assert "--out" in c, f"writes to a default path in the root: {c}"
            if c.startswith("nanoplan probe"):
                assert "--dir" in c, c


@pytest.mark.parametrize("mode", ["", "<!-- docs: shape -->", "<!-- docs: timings -->"])
def test_a_command_that_wraps_elsewhere_on_another_machine_still_matches(tmp_path: Path, mode: str) -> None:
    """Issue 28: in a venv at a longer path, `launching: <interpreter> -m torch.distributed.run ...` wrapped at
    another word, and the README's run block failed the check on a fresh clone."""
    from nanoplan.common import wrap_command

    words = ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=3",
             "-m", "runner.train", "--plan", "tour/tiny.probed.json", "--run-dir", "tour/run"]
    here = wrap_command("launching: ", ["/usr/bin/python", *words], 80).replace("/usr/bin/python", "python")
    long_path = "/home/someone/projects/nanoplan-fresh-clone/.venv/bin/python"
    there = wrap_command("launching: ", [long_path, *words], 80).replace(long_path, "python")
    assert here.splitlines() != there.splitlines()            # the wrap really falls elsewhere
    block = rd.parse(f"{mode}\n```console\n$ true\n```")[1][0]
    assert rd.same_output(block, here.splitlines(), there.splitlines())
    assert not rd.same_output(block, here.splitlines(), there.replace("tour/run", "tour/other").splitlines())
    assert rd.unwrapped(["a \\", "    b \\", "  c", "d"]) == ["a b c", "d"]
