"""The one path every command writes a user's file by (plans, charts, launch files, profiles, model and token
files): checked first, written to a temp file beside the target, fsynced and renamed, and a failure is one line.

- Where: `check_target` before anything is computed. A directory, a parent that is not a directory,
  or a missing chain of folders is bad input (PlanError, exit 2). nanoplan makes at most
  the last folder of a path (`--out tour/plan.json` makes tour/; `--out /nonexistent/dir/plan.json`
  is refused: a missing chain is what a typo looks like). Directories nanoplan manages itself (a run
  dir, a probe dir, a DATA_DIR) are made with their parents, as before.
- How: `atomic_output` yields a temp path beside the target (the same filesystem, so the rename is
  atomic) and renames it over the target when the block ends; on any failure the temp file is removed.
  A character device or FIFO (`--out /dev/null`, `/dev/stdout`) is written to directly, as a shell's
  `>` would (a rename would replace the device): /dev/null discards the output, /dev/full fails.
- A failure (disk full, I/O error, no permission, a file-size limit): WriteFailed, whose str() is the
  one line `PATH could not be written: No space left on device [errno ENOSPC]; nothing was written
  there (free disk space, or give --out another path)`. The CLI prints it as `error: ...` and exits 4
  (nanoplan/cli.py), as `nanoplan run` and `probe` do for their own files.

Plain Python, no torch.
"""

from __future__ import annotations

import errno as _errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from planner.errors import PlanError, WriteFailed, clip

EXIT_WRITE = WriteFailed.exit_code


def write_problem(path: Path | str, e: OSError) -> str:
    """'PATH could not be written: No space left on device [errno ENOSPC]'."""
    why = f"{os.strerror(e.errno)} [errno {_errno.errorcode.get(e.errno, e.errno)}]" if e.errno else str(e)[:200]
    return f"{path} could not be written: {why}"


def failed(path: Path | str, e: OSError, option: str = "--out", done: str = "nothing was written there") -> WriteFailed:
    """The WriteFailed for `e` at `path`: what happened, what was kept, and the fix."""
    return WriteFailed(f"{write_problem(path, e)}; {done} (free disk space, or give {option} another path)")


def is_device(path: str | Path) -> bool:
    """A character device or FIFO (/dev/null, /dev/stdout, a named pipe): written to directly, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_target(path: str | Path, option: str = "--out") -> bool:
    """True when a file may be written at `path` (a device such as /dev/null included); PlanError (exit 2) for
    a directory, a parent that is not a directory, or a parent that is missing together with its own parent
    (at most the last folder of a path is made)."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except OSError:
        mode = None
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise PlanError(option, f"{clip(str(path), 200)} is a directory",
                            f"give a file name, e.g. {option} {str(path).rstrip('/')}/{_example(option)}")
        return True
    parent = p.parent
    if parent.is_dir():
        return True
    if parent.exists() or parent.is_symlink():
        raise PlanError(option, f"{clip(str(parent), 200)} is not a directory", "give a path in a directory")
    if not parent.parent.is_dir():
        missing = parent
        while not missing.parent.is_dir() and missing.parent != missing:
            missing = missing.parent
        raise PlanError(option, f"the directory {clip(str(missing), 200)} does not exist",
                        f"nanoplan makes at most the last folder of a path; create the rest first (mkdir -p "
                        f"{clip(str(parent), 200)}), or check the path for a typo")
    return True


def _example(option: str) -> str:
    return "chart.png" if option == "--plot" else "plan.json"


def _make_parent(p: Path, option: str) -> None:
    """The target's folder, if it is missing and its own parent exists (check_target refused anything more)."""
    if not p.parent.is_dir():
        try:
            p.parent.mkdir()
        except FileExistsError:
            pass
        except OSError as e:
            raise failed(p.parent, e, option) from None


@contextmanager
def atomic_output(path: str | Path, option: str = "--out", *, mode: int = 0o666) -> Iterator[Path]:
    """A temp path beside `path` to write to; renamed over `path` (fsynced, `mode` less the umask) when the block
    ends. An OSError inside the block or at the rename is WriteFailed naming `path`; the temp file is removed
    whatever happens. Call check_target first."""
    import tempfile  # noqa: PLC0415  (random, shutil: only when a file is written)

    p = Path(path)
    _make_parent(p, option)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        os.close(fd)
    except OSError as e:
        raise failed(p, e, option) from None
    t = Path(tmp)
    try:
        yield t
        with open(t, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(t, mode & ~umask)       # mkstemp makes 0600: the file gets the usual permissions
        os.replace(t, p)
    except OSError as e:
        raise failed(p, e, option) from None
    finally:
        t.unlink(missing_ok=True)


def write_output(path: str | Path, data: str | bytes, option: str = "--out") -> None:
    """Write `data` to the user's file `path` through atomic_output (a device directly). PlanError (exit 2) for a
    bad target, WriteFailed (exit 4) for a failed write."""
    check_target(path, option)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if is_device(path):
        try:
            with open(path, "wb") as f:
                f.write(raw)
        except OSError as e:
            raise failed(path, e, option) from None
        return
    with atomic_output(path, option) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)
