"""The README's commands run: every bash/console command not marked `<!-- docs: skip -->` or
`no-test` is run, in order, in a scratch copy of the repository, and must exit as documented.

The parser and runner are scripts/render_docs.py's, the same code that renders the console blocks.
"""

from __future__ import annotations

import importlib.util
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
        "<!-- docs: skip -->", "```bash", "pip install nothing", "```", "",
        "<!-- docs: columns=120, no-test, rc=2 -->", "", "```console", "$ false", "error: x", "```",
        "```python", "print(1)", "```",
    ])
    _, blocks = rd.parse(text)
    assert [b.lang for b in blocks] == ["console", "bash", "console", "python"]
    first, setup, wide, code = blocks
    assert [c.text for c in first.commands] == ["echo a \\\n  b", "true"]
    assert first.commands[0].output == ["a b"] and first.commands[1].output == []
    assert first.tested and first.columns == rd.DEFAULT_COLUMNS
    assert setup.skip and not setup.tested and [c.text for c in setup.commands] == ["pip install nothing"]
    assert wide.columns == 120 and not wide.tested and not wide.skip
    assert wide.expected_rc(wide.commands[0]) == 2
    assert code.commands == []


def test_render_replaces_output_keeps_skipped_blocks_and_is_idempotent(tmp_path: Path) -> None:
    doc = "\n".join([
        "intro",
        "```console", "$ echo $COLUMNS; echo hello", "stale output", "```",
        "<!-- docs: columns=120 -->", "```console", "$ echo $COLUMNS", "```",
        "<!-- docs: skip -->", "```console", "$ echo never", "kept as written", "```",
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


def test_a_broken_command_fails_the_render(tmp_path: Path) -> None:
    work = rd.scratch_copy(tmp_path / "copy")
    with pytest.raises(RuntimeError, match="exited 2"):
        rd.render_text("```console\n$ nanoplan estimate --gpu H999 --budget 10\n```", work)
    # A block that documents the error (its output shows an `error:` line) renders.
    text, _ = rd.render_text("```console\n$ nanoplan estimate --gpu H999 --budget 10\nerror: old\n```", work)
    assert "error: --gpu" in text


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path: Path) -> None:
    _, blocks = rd.parse((REPO / "README.md").read_text())
    tested = [c for b in blocks if b.tested for c in b.commands]
    assert len(tested) >= 10, "the README tour lost its commands"
    assert any("nanoplan run" in c.text for c in tested)
    assert any("nanoplan calibrate" in c.text for c in tested)
    skipped = [c.text for b in blocks if not b.tested for c in b.commands]
    assert any(c.startswith("pip install") for c in skipped)
    work = rd.scratch_copy(tmp_path / "copy")
    # About 40 s on an idle 2-core machine (probe and run are real torchrun launches); no time
    # limit is asserted, since a loaded machine is several times slower.
    results = rd.run_blocks(blocks, work, tested_only=True)
    for block, command, result in results:
        assert rd.ok(block, command, result), (
            f"README command failed (exit {result.returncode}): $ {command.text}\n"
            + "\n".join(result.output[-15:]))
    assert len(results) == len(tested)
