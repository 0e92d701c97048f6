"""Is a trainer's checkpoint file whole? Checks that read headers and directories, never tensors (no torch).

- A `torch.save` file (nanochat's model_/optim_ files, DeepSpeed's *_states.pt) is a zip archive (torch's
  default format since 1.6) whose central directory and end record are written last, when the writer
  closes it. A file cut short anywhere (a kill during the save; nanochat and DeepSpeed write in place, not
  by rename) has no end record, so `zipfile` refuses it. `torch_file_problem` opens the archive's
  directory, requires its `*/data.pkl` (the pickle torch.load reads first) and every member to lie inside
  the file. It reads a few KiB whatever the file's size: loading a d20 optimizer state (GBs) to check it
  would add minutes to every relaunch, and the trainer loads it anyway.
- A torch DCP checkpoint (torchtitan's step-N/) is complete when its `.metadata` exists: DCP's coordinator
  writes it (to `.metadata.tmp`, then a rename) only after every rank's `__R_I.distcp` was written
  (torch/distributed/checkpoint/filesystem.py, `FileSystemWriter.finish`). `.metadata` is a pickle;
  `dcp_files` lists the data files it names by scanning its opcodes (pickletools), without running it,
  so a step dir that torchtitan's purge of old checkpoints half deleted is caught too.
"""

from __future__ import annotations

import os
import pickletools
import re
import shutil
import stat
import zipfile
from pathlib import Path

DCP_METADATA = ".metadata"
DCP_FILE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


def torch_file_problem(path: Path) -> str | None:
    """Why `path` is not a whole torch.save archive, or None when it is."""
    try:
        st = path.lstat()
    except OSError:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return f"not a whole torch.save archive ({e})"
    if not any(i.filename.endswith("/data.pkl") or i.filename == "data.pkl" for i in infos):
        return "not a torch.save archive (no data.pkl)"
    if any(i.header_offset + i.compress_size > st.st_size for i in infos):
        return "cut short (a member ends past the end of the file)"
    return None


def json_file_problem(path: Path) -> tuple[dict | None, str | None]:
    """(the JSON object, None) or (None, why not). Python's json reads `Infinity` and `NaN`, which nanochat's
    meta_*.json may hold (its min_val_bpb starts at float("inf")): not strict JSON, but what it writes."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "missing"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"not whole JSON ({str(e)[:80]})"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, None


def dcp_files(step_dir: Path) -> tuple[list[str] | None, str | None]:
    """The data files a DCP checkpoint's .metadata names ((names, None)), or (None, why it is not complete)."""
    meta = step_dir / DCP_METADATA
    try:
        raw = meta.read_bytes()
    except FileNotFoundError:
        return None, "no .metadata (DCP writes it last)"
    except OSError as e:
        return None, f".metadata unreadable ({e.strerror or e})"
    names: set[str] = set()
    try:
        for op, arg, _ in pickletools.genops(raw):
            if isinstance(arg, str) and DCP_FILE.match(arg):
                names.add(arg)
            if op.name == "STOP":
                break
        else:
            return None, ".metadata is cut short"
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        return None, f".metadata is not a whole pickle ({str(e)[:80]})"
    if not names:
        return None, ".metadata names no data file"
    for n in sorted(names):
        p = step_dir / n
        try:
            st = p.lstat()
        except OSError:
            return None, f"{n} is missing"
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None, f"{n} is empty or not a file"
    return sorted(names), None


def dcp_ranks(names: list[str]) -> int:
    """How many ranks wrote a DCP checkpoint (its files are __RANK_INDEX.distcp)."""
    return len({int(m.group(1)) for n in names if (m := DCP_FILE.match(n))})


def remove_path(path: Path) -> None:
    """Delete a file, or a directory tree, never through a link (a link itself is unlinked, not followed)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)            # rmtree never follows links inside the tree (it unlinks them)
    else:
        os.unlink(path)
