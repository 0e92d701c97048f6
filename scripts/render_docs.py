"""Re-run the console blocks of the README and docs/ and write back their real output.

A block that starts with ```console is rendered: each line starting with `$ ` is a command
(a trailing backslash continues it on the next line) and everything up to the next `$ ` line
is its output, which this script replaces with what the command prints today (stdout and
stderr together). An HTML comment on the line before a block changes that:

    <!-- docs: skip -->          left exactly as it is, never run (installs, GPU commands)
    <!-- docs: no-check -->      re-rendered by this script, but not run by --check (CI): a slow block
    <!-- docs: shape -->         --check compares the output's shape, not its digits (machine-dependent)
    <!-- docs: timings -->       --check compares the output exactly, except durations and rates
    <!-- docs: columns=120 -->   the terminal width for this block (default 80)
    <!-- docs: timeout=300 -->   seconds per command (default 600)
    <!-- docs: rc=2 -->          the exit code every command of the block must give (default 0)
    <!-- docs: skip, why=it installs packages -->   `why=` (last) says why a block is not run

Options combine with commas: `<!-- docs: columns=120, shape -->`. `why=` takes the rest of the
comment, commas included; skip and no-check blocks must give one.

Shape, for blocks whose digits depend on the machine (probe, run, calibrate, timings): the output
and the recorded one must hold the same words and symbols in the same order, where
  - every number, with the unit right after it (12.5 s, 3 min, 18.0 MB/s, 9.3 MiB, 30.7k, 47%,
    $0.00, 0m05s), counts as one placeholder, so "6.1 s" matches "1.2 min";
  - spacing and line breaks do not count (column widths and wrapping follow the digits);
  - row markers (* and ★, the row a measurement picked) do not count, nor the length of a ─ rule;
  - a line that repeats the line before it with other numbers (progress lines) counts once.
A `timings` block is compared the same way, but only durations and rates (a number followed by
ns/us/ms/s/min/h, or by a unit per second) are placeholders: every other digit must match.
Any other block must match exactly. The interpreter's path prints as `python`, the scratch
copy's path as `.`, in every block.

All blocks of one file run in order in one fresh scratch copy of the repository (tracked and
untracked, not ignored, files), so later blocks see the files earlier ones wrote and nothing is
written into the working tree. Documented commands may write only where git ignores (a file a
reader's `git status` would show is an error): the tour's outputs go to ignored paths.
Commands run under `bash -o pipefail` with COLUMNS set, stdin closed and the copy's own code first
on PYTHONPATH; `nanoplan` on PATH runs the copy's CLI. A command whose exit code is not the
expected one stops the render of that file and nothing is written. Without `rc=`, a non-zero exit
is accepted only when the output the file shows for that command already has an `error:` line (a
documented failure); to show an exit code, end the command with `; echo "exit code $?"`.

    python scripts/render_docs.py                  # README.md and docs/*.md
    python scripts/render_docs.py docs/running.md  # one file
    python scripts/render_docs.py --check          # list the blocks whose output changed; write nothing

Each command's wall time is logged on stderr (`--check` runs in CI: keep it fast).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
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
    def checked(self) -> bool:
        """True when --check (CI) runs this block."""
        return not self.skip and "no-check" not in self.options

    @property
    def mode(self) -> str:
        """How --check compares the block's output: 'exact', 'shape' or 'timings'."""
        modes = [m for m in ("shape", "timings") if m in self.options]
        return modes[0] if modes else "exact"

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


KNOWN_OPTIONS = ("skip", "no-check", "shape", "timings", "columns", "timeout", "rc", "why")


def _options(line: str) -> dict[str, str] | None:
    match = _DIRECTIVE.match(line)
    if match is None:
        return None
    out: dict[str, str] = {}
    text, _, why = match.group(1).partition("why=")
    if why:
        out["why"] = why.strip()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    unknown = [k for k in out if k not in KNOWN_OPTIONS]
    if unknown:
        raise ValueError(f"unknown docs option {unknown[0]!r} in {line.strip()!r}; known: {', '.join(KNOWN_OPTIONS)}")
    if ("skip" in out or "no-check" in out) and not out.get("why"):
        raise ValueError(f"{line.strip()!r}: a block that is not run says why (add `, why=...`)")
    if "shape" in out and "timings" in out:
        raise ValueError(f"{line.strip()!r}: give one of shape or timings")
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
        try:
            options = (_options(lines[k]) if k >= 0 else None) or {}
        except ValueError as exc:
            raise ValueError(f"line {k + 1}: {exc}") from None
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
    seconds: float = 0.0           # wall clock
    cpu_seconds: float = 0.0       # user + system time of the command and its children


def _children_cpu() -> float:
    import resource  # noqa: PLC0415  (POSIX only, like bash)

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_command(cmd: str, workdir: Path, columns: int, timeout: float) -> Result:
    """Run one documented command in workdir; stdout and stderr together, cleaned up."""
    t0, c0 = time.perf_counter(), _children_cpu()
    try:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=workdir,
                              env=command_env(workdir, columns), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        raw, code = proc.stdout.decode("utf-8", "replace"), proc.returncode
    except subprocess.TimeoutExpired as exc:
        raw = (exc.stdout or b"").decode("utf-8", "replace") + f"\n(timed out after {timeout:.0f} s)"
        code = 124
    text = raw.replace(str(workdir) + "/", "").replace(str(workdir), ".").replace(sys.executable, "python")
    out = [line.rstrip() for line in text.split("\n")]
    while out and not out[-1]:
        out.pop()
    return Result(command=cmd, returncode=code, output=out, seconds=time.perf_counter() - t0,
                  cpu_seconds=_children_cpu() - c0)


# ---------------------------------------------------------------- shape: machine-dependent output

_NUM = r"[-+−]?\$?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_TIME_UNITS = r"ns|us|µs|ms|s|sec|min|h"
_DURATION = r"\d+h\d+m\d+s|\d+m\d+s"          # the run display's 1h02m03s and 0m05s
# shape: a number and the unit that changes with its magnitude (bytes, time, a count suffix, %) are one
_SHAPE_NUM = re.compile(_DURATION + "|" + _NUM + r"(?:\s?(?:[kKMGTP]i?B(?:/s)?|B/s|" + _TIME_UNITS
                        + r")(?![A-Za-z])|[kMBT%](?![A-Za-z]))?")
# timings: only durations (12.5 s, 0m05s) and rates (18.0 MB/s, 3,210 tok/s)
_TIMING = re.compile(_DURATION + "|" + _NUM + r"\s?(?:" + _TIME_UNITS + r"|[A-Za-z]+/s)(?![A-Za-z])")
_RULE = re.compile(r"^[─━═]+$")
PLACEHOLDER = "#"


def skeleton(lines: list[str], mode: str) -> list[str]:
    """The words and symbols --check compares for a `shape` or `timings` block (see the module doc)."""
    pattern = _SHAPE_NUM if mode == "shape" else _TIMING
    out: list[str] = []
    previous: list[str] | None = None
    for line in lines:
        text = pattern.sub(PLACEHOLDER, line)
        if mode == "shape":
            text = text.replace("*", " ").replace("★", " ")
        tokens = ["─" if _RULE.match(t) else t for t in text.split()]
        if not tokens or tokens == previous:      # blank, or a progress line repeated
            continue
        previous = tokens
        out.extend(tokens)
    return out


def unwrapped(lines: list[str]) -> list[str]:
    """The lines with every shell continuation (a line ending in ` \\`) joined to the next one by one space.

    A printed command (`launching: python -m torch.distributed.run ...`) wraps at the terminal's width
    before the interpreter's path is replaced by `python`, so where it wraps depends on how long that path
    is on the machine that renders: the check compares commands, not where they wrap."""
    out: list[str] = []
    joining = False
    for line in lines:
        text = line.strip() if joining else line
        if joining:
            out[-1] = f"{out[-1]} {text}" if text else out[-1]
        else:
            out.append(text)
        joining = out[-1].endswith(" \\")
        if joining:
            out[-1] = out[-1][:-2].rstrip()
    return out


def same_output(block: Block, recorded: list[str], now: list[str]) -> bool:
    """Whether a command's output still matches the recorded one, as the block's mode compares (commands
    that wrap at another word, as on a machine with a longer interpreter path, still match)."""
    recorded, now = unwrapped(recorded), unwrapped(now)
    if block.mode == "exact":
        return recorded == now
    return skeleton(recorded, block.mode) == skeleton(now, block.mode)


def ok(block: Block, command: Command, result: Result) -> bool:
    """Whether the command exited as the block expects."""
    expected = block.expected_rc(command)
    if expected is None:
        return result.returncode not in (124, 137) and any(
            line.startswith("error:") for line in result.output)
    return result.returncode == expected


def run_blocks(blocks: list[Block], workdir: Path, *, check: bool = False,
               log=None) -> list[tuple[Block, Command, Result]]:
    """Run the commands of the console blocks, in order, in workdir; stop at the first failure.
    With check, the no-check blocks are left out."""
    done: list[tuple[Block, Command, Result]] = []
    for block in blocks:
        if block.skip or not block.commands or block.lang != "console" or (check and not block.checked):
            continue
        for command in block.commands:
            result = run_command(command.text, workdir, block.columns, block.timeout)
            if log is not None:
                log(f"  {result.seconds:6.1f} s {result.cpu_seconds:6.1f} s cpu  $ {command.text}")
            done.append((block, command, result))
            if not ok(block, command, result):
                return done
    return done


def render_text(text: str, workdir: Path, log=None, check: bool = False) -> tuple[str, list[str]]:
    """The file with every console block re-run; also the commands whose output changed."""
    lines, blocks = parse(text)
    results = run_blocks(blocks, workdir, log=log, check=check)
    for block, command, result in results:
        if not ok(block, command, result):
            shown = "\n".join(result.output[-20:])
            raise RuntimeError(f"`{command.text}` exited {result.returncode}:\n{shown}")
    changed: list[str] = []
    by_block: dict[int, list[tuple[Command, Result]]] = {}
    for block, command, result in results:
        by_block.setdefault(block.start, []).append((command, result))
        if not same_output(block, command.output, result.output):
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


# ---------------------------------------------------------------- documented commands write only where git ignores

def files_under(root: Path) -> set[str]:
    """Every file below root, as paths relative to it (the docs' own .docs-bin left out)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if (p.is_file() or p.is_symlink()) and p.relative_to(root).parts[0] != ".docs-bin"}


def stray_files(names: set[str], repo: Path = ROOT) -> list[str]:
    """The names that git (repo's .gitignore files) does not ignore: what `git status` would show."""
    if not names:
        return []
    try:
        proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-z"], cwd=repo,
                              input="\0".join(sorted(names)).encode(), capture_output=True)
    except OSError:
        return []
    if proc.returncode not in (0, 1):          # not a git checkout: nothing to compare with
        return []
    ignored = set(proc.stdout.decode().split("\0"))
    return sorted(n for n in names if n not in ignored)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def default_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render_file(path: Path, check: bool, log) -> tuple[str, list[str]]:
    """Run one file's blocks in a scratch copy: (the re-rendered text, the commands whose output changed).
    RuntimeError when a command fails or the commands wrote a file git does not ignore."""
    text = path.read_text()
    with tempfile.TemporaryDirectory(prefix="nanoplan-docs-") as tmp:
        workdir = scratch_copy(Path(tmp))
        before = files_under(workdir)
        new, changed = render_text(text, workdir, log=log, check=check)
        stray = stray_files(files_under(workdir) - before)
    if stray:
        raise RuntimeError(f"the commands wrote {len(stray)} file(s) that git does not ignore: "
                           f"{', '.join(stray[:8])}{' ...' if len(stray) > 8 else ''}; write to an ignored "
                           "path (see .gitignore) so that a reader's checkout stays clean")
    return new, changed


def main(argv: list[str] | None = None) -> int:
    """Render the given markdown files (default: README.md and docs/*.md)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true",
                        help="run every checked block, report those whose output changed, write nothing")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    status = 0
    t0, c0 = time.perf_counter(), _children_cpu()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    for path in files:
        path = path.resolve()
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        try:
            _, blocks = parse(path.read_text())
        except ValueError as exc:
            log(f"error: {name}: {exc}")
            status = 1
            continue
        if not any(b.lang == "console" and b.commands and not b.skip and (b.checked or not args.check)
                   for b in blocks):
            continue
        log(f"{name}:")
        try:
            new, changed = render_file(path, args.check, log)
        except RuntimeError as exc:
            log(f"error: {name}: {exc}")
            status = 1
            continue
        for cmd in changed:
            log(f"  changed: $ {cmd}")
        if args.check:
            status = status or (1 if changed else 0)
        elif new != path.read_text():
            _write_atomic(path, new)
    log(f"{'checked' if args.check else 'rendered'} in {time.perf_counter() - t0:.0f} s "
        f"({_children_cpu() - c0:.0f} s of CPU)")
    return status


if __name__ == "__main__":
    sys.exit(main())
