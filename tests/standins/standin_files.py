"""What the stand-in trainers share: files in torch.save's format, written slowly and in place (no torch).

torch.save writes a zip archive (`NAME/data.pkl`, `NAME/byteorder`, `NAME/data/0`, ..., `NAME/version`) whose
central directory comes last, when the file is closed. These files have the same layout, with a plain pickle
as data.pkl, so torch.load(weights_only=True) reads them (the tests check it), and they are written the way
nanochat and DeepSpeed write theirs: straight into the final path, chunk by chunk, with no rename. A kill
during the write leaves a file cut short. The stand-ins' own knobs (environment variables):

- STANDIN_STEP_S: seconds per training step (default 0.1)
- STANDIN_SAVE_S: seconds to write one checkpoint file (default 0.1)
- STANDIN_FILE_BYTES: the payload of each checkpoint file (default 65536)
- STANDIN_STARTUP_S: the start-up before the first step (imports, compile; default 0.3)
"""

from __future__ import annotations

import os
import pickle
import time
import zipfile


def knob(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw else default


def write_torch_file(path: str, state: dict, payload: int | None = None, seconds: float | None = None) -> None:
    """A torch.save-format archive of `state` at `path`, its `payload` bytes written over `seconds`."""
    payload = int(knob("STANDIN_FILE_BYTES", 65536)) if payload is None else payload
    seconds = knob("STANDIN_SAVE_S", 0.1) if seconds is None else seconds
    name = os.path.splitext(os.path.basename(path))[0]
    chunk = 4096
    n = max(1, payload // chunk)
    with open(path, "wb", buffering=0) as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/data.pkl", pickle.dumps(state, protocol=2))
        z.writestr(f"{name}/byteorder", "little")
        with z.open(f"{name}/data/0", "w") as f:
            for _ in range(n):
                f.write(b"\0" * chunk)
                time.sleep(seconds / n)
        z.writestr(f"{name}/version", "3\n")


def read_torch_file(path: str) -> dict:
    """The state a stand-in saved (FileNotFoundError, zipfile.BadZipFile when absent or cut short)."""
    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return pickle.loads(z.read(pkl))


def chain(x: int, step: int) -> int:
    """The stand-ins' "weights": a value every step changes, so a resume from the wrong state shows."""
    return (x * 1_000_003 + step + 1) % (1 << 61)


def weights_at(step: int) -> int:
    """What the weights are after `step` steps of an uninterrupted run."""
    x = 0
    for s in range(step):
        x = chain(x, s)
    return x
