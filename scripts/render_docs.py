"""Re-run the console blocks of the README and docs/ and write back their real output.

A block that starts with ```console is rendered: each line starting with `$ ` is a command
(a trailing backslash continues it on the next line) and everything up to the next `$ ` line
is its output, which this script replaces with what the command prints today (stdout and
stderr together). An HTML comment on the line before a block changes that:

    <!-- docs: skip -->          left exactly as it is, and not run by the tests (slow, GPU, installs)
    <!-- docs: no-test -->       rendered here, but not run by tests/test_readme_commands.py
    <!-- docs: columns=120 -->   the terminal width for this block (default 80)
    <!-- docs: timeout=300 -->   seconds per command (default 600)
    <!-- docs: rc=2 -->          the exit code every command of the block must give (default 0)

Options combine with commas: `<!-- docs: columns=120, no-test -->`.

All blocks of one file run in order in one fresh scratch copy of the repository (tracked and
untracked, not ignored, files), so later blocks see the files earlier ones wrote and nothing is
written into the working tree. Commands run under `bash -o pipefail` with COLUMNS set, stdin
closed and the copy's own code first on PYTHONPATH; `nanoplan` on PATH runs the copy's CLI.
A command whose exit code is not the expected one stops the render of that file and nothing is
written. Without `rc=`, a non-zero exit is accepted only when the output the file shows for that
command already has an `error:` line (a documented failure); to show an exit code, end the command
with `; echo "exit code $?"`.

    python scripts/render_docs.py                  # README.md and docs/*.md
    python scripts/render_docs.py docs/running.md  # one file
    python scripts/render_docs.py --check          # list the blocks whose output changed; write nothing
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COLUMNS = 80
DEFAULT_TIMEOUT = 600
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(.*?)\s*-->\s*$")
_FENCE_OPEN = re.compile(r"^```(\w[\w+-]*)?\s*$")


@dataclass
class Command:
    """One `$ ` command of a console block and the output the file shows for it."""

    text: str                      # the command as run (continuation lines joined with newlines)
    shown: list[str]               # the lines of the command as written, `$ ` included
    output: list[str] = field(default_factory=list)


@dataclass
class Block:
    """A fenced code block: where it is, its language and its directives."""

    start: int                     # index of the opening fence line
    end: int                       # index of the closing fence line
    lang: str
    options: dict[str, str]
    commands: list[Command]

    @property
    def skip(self) -> bool:
        """True when the block must not be re-run."""
        return "skip" in self.options

    @property
    def tested(self) -> bool:
        """True when tests/test_readme_commands.py runs this block."""
        return not self.skip and "no-test" not in self.options

    @property
    def columns(self) -> int:
        """Terminal width for the block's commands."""
        return int(self.options.get("columns", DEFAULT_COLUMNS))

    def expected_rc(self, command: Command) -> int | None:
        """The exit code the command must give; None accepts any (a documented error)."""
        if "rc" in self.options:
            return int(self.options["rc"])
        if any(line.startswith("error:") for line in command.output):
            return None
        return 0

    @property
    def timeout(self) -> float:
        """Seconds allowed per command."""
        return float(self.options.get("timeout", DEFAULT_TIMEOUT))


def _options(line: str) -> dict[str, str] | None:
    match = _DIRECTIVE.match(line)
    if match is None:
        return None
    out: dict[str, str] = {}
    for part in match.group(1).split(","):
        part = part.strip()
        if not part:
            continue
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


def _parse_console(body: list[str]) -> list[Command]:
    commands: list[Command] = []
    i = 0
    while i < len(body):
        line = body[i]
        if line.startswith("$ ") or line == "$":
            shown = [line]
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(body):
                i += 1
                shown.append(body[i])
                text = text + "\n" + body[i]
            commands.append(Command(text=text, shown=shown))
        elif commands:
            commands[-1].output.append(line)
        i += 1
    return commands


def _parse_shell(body: list[str]) -> list[Command]:
    """Commands of a bash/sh block: one per line (comments and blank lines dropped)."""
    commands: list[Command] = []
    pending: list[str] = []
    for line in body:
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        pending.append(line)
        if stripped.endswith("\\"):
            continue
        commands.append(Command(text="\n".join(pending), shown=list(pending)))
        pending = []
    if pending:
        commands.append(Command(text="\n".join(pending), shown=list(pending)))
    return commands


def parse(text: str) -> tuple[list[str], list[Block]]:
    """Split a markdown file into lines and its fenced code blocks."""
    lines = text.split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if match is None:
            i += 1
            continue
        lang = match.group(1) or ""
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j >= len(lines):
            raise ValueError(f"line {i + 1}: code block is never closed")
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        options = (_options(lines[k]) if k >= 0 else None) or {}
        body = lines[i + 1:j]
        if lang == "console":
            commands = _parse_console(body)
        elif lang in ("bash", "sh", "shell"):
            commands = _parse_shell(body)
        else:
            commands = []
        blocks.append(Block(start=i, end=j, lang=lang, options=options, commands=commands))
        i = j + 1
    return lines, blocks


def scratch_copy(dest: Path, root: Path = ROOT) -> Path:
    """Copy the repository's tracked and untracked (not ignored) files into dest."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, check=True, capture_output=True).stdout.decode().split("\0")
        names = [n for n in listed if n]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(root)) for p in root.rglob("*")
                 if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts]
    for name in names:
        src = root / name
        if not src.is_file():           # deleted in the working tree, or a submodule
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    bindir = dest / ".docs-bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "nanoplan"
    shim.write_text(f"#!{sys.executable}\nimport sys\nfrom nanoplan.cli import main\n"
                    "sys.argv[0] = 'nanoplan'\nsys.exit(main())\n")
    shim.chmod(0o755)
    return dest


def command_env(workdir: Path, columns: int) -> dict[str, str]:
    """The environment a documented command runs in."""
    env = dict(os.environ)
    env["COLUMNS"] = str(columns)
    env["LINES"] = "40"
    env["PYTHONPATH"] = str(workdir)
    env["PATH"] = f"{workdir / '.docs-bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    for name in ("FORCE_COLOR", "CLICOLOR_FORCE", "PYTEST_CURRENT_TEST", "TERM_PROGRAM"):
        env.pop(name, None)
    env["NO_COLOR"] = "1"
    env["TERM"] = "xterm-256color"
    return env


@dataclass
class Result:
    """What one command did."""

    command: str
    returncode: int
    output: list[str]


def run_command(cmd: str, workdir: Path, columns: int, timeout: float) -> Result:
    """Run one documented command in workdir; stdout and stderr together, cleaned up."""
    try:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=workdir,
                              env=command_env(workdir, columns), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        raw, code = proc.stdout.decode("utf-8", "replace"), proc.returncode
    except subprocess.TimeoutExpired as exc:
        raw = (exc.stdout or b"").decode("utf-8", "replace") + f"\n(timed out after {timeout:.0f} s)"
        code = 124
    text = raw.replace(str(workdir) + "/", "").replace(str(workdir), ".")
    out = [line.rstrip() for line in text.split("\n")]
    while out and not out[-1]:
        out.pop()
    return Result(command=cmd, returncode=code, output=out)


def ok(block: Block, command: Command, result: Result) -> bool:
    """Whether the command exited as the block expects."""
    expected = block.expected_rc(command)
    if expected is None:
        return result.returncode not in (124, 137) and any(
            line.startswith("error:") for line in result.output)
    return result.returncode == expected


def run_blocks(blocks: list[Block], workdir: Path, *, tested_only: bool = False,
               log=None) -> list[tuple[Block, Command, Result]]:
    """Run the commands of the blocks, in order, in workdir; stop at the first failure."""
    done: list[tuple[Block, Command, Result]] = []
    for block in blocks:
        if block.skip or not block.commands or (tested_only and not block.tested):
            continue
        if block.lang != "console" and not tested_only:
            continue
        for command in block.commands:
            if log is not None:
                log(f"  $ {command.text}")
            result = run_command(command.text, workdir, block.columns, block.timeout)
            done.append((block, command, result))
            if not ok(block, command, result):
                return done
    return done


def render_text(text: str, workdir: Path, log=None) -> tuple[str, list[str]]:
    """The file with every console block re-run; also the commands whose output changed."""
    lines, blocks = parse(text)
    results = run_blocks(blocks, workdir, log=log)
    for block, command, result in results:
        if not ok(block, command, result):
            shown = "\n".join(result.output[-20:])
            raise RuntimeError(f"`{command.text}` exited {result.returncode}:\n{shown}")
    changed: list[str] = []
    by_block: dict[int, list[tuple[Command, Result]]] = {}
    for block, command, result in results:
        by_block.setdefault(block.start, []).append((command, result))
        if command.output != result.output:
            changed.append(command.text)
    out: list[str] = []
    cursor = 0
    for block in blocks:
        if block.start not in by_block:
            continue
        out.extend(lines[cursor:block.start + 1])
        for command, result in by_block[block.start]:
            out.extend(command.shown)
            out.extend(result.output)
        cursor = block.end
    out.extend(lines[cursor:])
    return "\n".join(out), changed


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def default_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    """Render the given markdown files (default: README.md and docs/*.md)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true",
                        help="run everything, report blocks whose output changed, write nothing")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    status = 0
    for path in files:
        path = path.resolve()
        text = path.read_text()
        _, blocks = parse(text)
        if not any(b.lang == "console" and not b.skip and b.commands for b in blocks):
            continue
        print(f"{path.relative_to(ROOT)}:", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="nanoplan-docs-") as tmp:
            workdir = scratch_copy(Path(tmp))
            try:
                new, changed = render_text(text, workdir,
                                           log=lambda m: print(m, file=sys.stderr))
            except RuntimeError as exc:
                print(f"error: {path.relative_to(ROOT)}: {exc}", file=sys.stderr)
                status = 1
                continue
        for cmd in changed:
            print(f"  changed: $ {cmd}", file=sys.stderr)
        if args.check:
            status = status or (1 if changed else 0)
        elif new != text:
            _write_atomic(path, new)
    return status


if __name__ == "__main__":
    sys.exit(main())
