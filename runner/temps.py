"""Temporary outputs that name their writer, and the clean-up of those whose writer died (kill -9).

A command that writes a large file (prepare-data's token files, export-model's model file) writes it
to `.NAME.wPID-HOST.XXXXXXXX.tmp` beside the target and renames it into place. A writer killed with -9
leaves that file behind (up to the model's size); the next writer into the same directory removes the
temporaries whose writer is dead, on this host only (another host may share the disk and still be
writing), regular files only (never through a link). Plain Python, no torch.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

TEMP = re.compile(r"^\.(?P<name>.+)\.w(?P<pid>\d+)-(?P<host>[A-Za-z0-9-]*)\.[^/.]+\.tmp$")


def host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64]


def temp_prefix(name: str) -> str:
    """`.NAME.wPID-HOST.`: a temporary output of this process (see clean_dead)."""
    return f".{name}.w{os.getpid()}-{host()}."


def make_temp(target: Path) -> Path:
    """An empty temporary for `target`, beside it, naming this process (mode 0600 until published)."""
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=".tmp", dir=target.parent)
    os.close(fd)
    return Path(tmp)


def clean_dead(directory: Path, names: Callable[[str], bool]) -> tuple[int, int]:
    """Remove the temporaries in `directory` of targets `names` accepts whose writer (on this host) is dead;
    never a link or anything but a regular file. Returns (files, bytes) removed."""
    from runner.launcher import pid_alive  # noqa: PLC0415

    n = size = 0
    here = host()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0, 0
    for e in entries:
        m = TEMP.match(e.name)
        if m is None or not names(m["name"]) or m["host"] != here:
            continue
        pid = int(m["pid"])
        if pid == os.getpid() or pid_alive(pid):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                continue
            os.unlink(e.path)
        except OSError:
            continue
        n, size = n + 1, size + st.st_size
    return n, size
