"""One torch file on disk: written atomically with its sha256 and size, read with torch.load(weights_only=True).

save_torch_atomic writes to a temp file, fsyncs and renames, hashing the bytes as they pass (no
second read). fsync_dir and sha256_file are the helpers every checkpoint writer and checker
shares (runner/checkpoint.py, runner/dcp.py). torch is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from planner.errors import PlanError

_HASH_CHUNK = 1 << 22


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it (so no second read).

    It keeps the OSError of a failed write: torch.save reports it only as an opaque
    "enforce fail ... unexpected pos" RuntimeError. `fail_errno` injects one (a test fault).
    """

    def __init__(self, f: Any, fail_errno: int | None = None) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None
        self.fail_errno = fail_errno

    def write(self, b: bytes) -> int:
        try:
            if self.fail_errno is not None and self.size > 0:
                raise OSError(self.fail_errno, os.strerror(self.fail_errno), getattr(self.f, "name", None))
            n = self.f.write(b)
        except OSError as e:
            self.error = e
            raise
        self.sha.update(b)
        self.size += len(b)
        return n

    def flush(self) -> None:
        self.f.flush()


def save_torch_atomic(obj: Any, path: Path, *, fail_errno: int | None = None) -> dict[str, Any]:
    """torch.save to a temp file, fsync, rename. Returns {"sha256", "bytes"}.

    A failed write (disk full, I/O error) raises the OSError itself and leaves no temp file.
    """
    import torch

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    w: _HashingWriter | None = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as f:
            w = _HashingWriter(f, fail_errno)
            torch.save(obj, w)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        err = w.error if w is not None and w.error is not None and not isinstance(e, OSError) else e
        if isinstance(err, OSError) and err.errno:    # name the checkpoint file, not its temp file
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None
        if err is not e:
            raise err from None
        raise
    return {"sha256": w.sha.hexdigest(), "bytes": w.size}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# torch's own advice on a refused file: load it with weights_only=False, or allowlist its globals. Neither is
# safe for a file of unknown origin, so no line that gives it is quoted back.
_UNSAFE_ADVICE = ("weights_only", "safe_globals", "add_safe_globals", "trusted source", "trust the source")
_BOILER = ("Weights only load failed", "Please file an issue", "Check the documentation", "(1)", "(2)")


def refusal_reason(e: BaseException) -> str:
    """What torch.load(weights_only=True) said about a file it refused, without its advice to load it unsafely:
    the WeightsUnpickler's finding (up to its first sentence) or the first plain line; at most 200 characters."""
    text = str(e)
    after = text.split("WeightsUnpickler error:", 1)[1] if "WeightsUnpickler error:" in text else ""
    found = [x.strip() for x in after.splitlines() if x.strip()]
    plain = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith(_BOILER)]
    why = (found or plain or [""])[0]
    for stop in (" was not an allowed global", ". Please", ". Re-running", ". To load", ". Do it only"):
        why = why.split(stop, 1)[0]
    if any(a in why.lower() for a in _UNSAFE_ADVICE):
        why = ""
    return why.strip()[:200]


def load_torch(path: Path, map_location: Any = "cpu") -> Any:
    """torch.load(weights_only=True): tensors and plain containers only, never a pickled object.

    A file that torch refuses (a pickle payload, a file that is not a torch checkpoint) raises
    a one-line PlanError naming the file; nothing in it is executed.
    """
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # e.g. "Detected pickle protocol 4" on foreign files
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load an untrusted file is the same refusal
        why = refusal_reason(e)
        if not isinstance(e, (pickle.UnpicklingError, OSError)):
            why = f"{type(e).__name__}: {why}" if why else type(e).__name__
        payload = isinstance(e, pickle.UnpicklingError) and "global" in str(e).lower()   # a class or function
        kind = ("holds pickled objects, not just tensors" if payload
                else "cannot be read" if isinstance(e, OSError) else "is not a torch checkpoint")
        raise PlanError(str(path), f"refused by torch.load(weights_only=True): it {kind} ({why})",
                        "it is not a nanoplan checkpoint; move it out of the run dir, or use another --run-dir") from None
