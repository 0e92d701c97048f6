"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and consolidation into one file.

zero2 and fsdp runs keep no whole copy of the model or optimizer on any rank. Their checkpoints
are written in parallel by every rank, inside the usual step directory (runner/checkpoint.py):

    checkpoints/step_00000040/
      dcp/model/   .metadata  __0_0.distcp  __1_0.distcp   model state (get_model_state_dict: DTensor
                                                           shards, named as in the plain GPT)
      dcp/optim/   .metadata  __0_0.distcp  __1_0.distcp   optimizer state, keyed by parameter name
      optim_rank0.pt    the LR schedulers' state (rank 0)
      rng_rank{r}.pt    every rank's RNG state
      meta.json         written last by rank 0, with the sha256 and size of every file above

After the collective ``dcp.save``, each rank hashes the shard files it wrote (``__{rank}_*``), and
rank 0 hashes ``.metadata`` and anything else. runner/checkpoint.py gathers the lists into
meta.json. The atomicity, verification, fallback and retention of DDP checkpoints hold
unchanged: a step directory counts only once meta.json exists and every checksum verifies.

Loading goes through ``get_state_dict`` / ``set_state_dict``
(torch.distributed.checkpoint.state_dict). DCP reshards on load, so a checkpoint can be read
by another number of ranks, or by a plain unsharded model in one process.
``runner.model_file.export_model_file`` turns ``dcp/model`` into one ``torch.save`` file of the GPT's
state dict (``format_utils.dcp_to_torch_save``).

DCP reads its shard files with ``torch.load(weights_only=True)`` but unpickles ``.metadata``
with plain ``pickle.load``. Before any load, ``check_metadata`` reads each ``.metadata`` with an
unpickler that only resolves DCP's own metadata classes (and torch.Size, dtypes, layouts,
paths), so a forged one is refused before it can run anything.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.errors import PlanError
from runner.torch_files import fsync_dir, sha256_file

DCP_DIR = "dcp"
MODEL_DIR = f"{DCP_DIR}/model"
OPTIM_DIR = f"{DCP_DIR}/optim"
MODEL_METADATA = f"{MODEL_DIR}/.metadata"


def has_shards(ckdir: Path) -> bool:
    return (ckdir / MODEL_METADATA).is_file()


def _file_info(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def hash_own_files(step_path: Path, sub: str, rank: int) -> dict[str, dict[str, Any]]:
    """{relative name: {sha256, bytes}} of the files in step_path/sub that this rank accounts for:
    its own shard files, plus (rank 0) the metadata and anything not named after a rank."""
    d = step_path / sub
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(d.iterdir()):
        if not f.is_file():
            continue
        name = f.name
        owner = 0
        if name.startswith("__") and "_" in name[2:]:
            head = name[2:].split("_", 1)[0]
            owner = int(head) if head.isdigit() else 0
        if owner == rank:
            out[f"{sub}/{name}"] = _file_info(f)
    fsync_dir(d)
    return out


def save_shards(step_path: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer],
                rank: int) -> dict[str, dict[str, Any]]:
    """Collective: DCP-save the model, then the optimizers, under step_path/dcp; return this rank's files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizers)
    files: dict[str, dict[str, Any]] = {}
    for sub, sd in ((MODEL_DIR, msd), (OPTIM_DIR, osd)):
        try:
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(step_path / sub, sync_files=True))
        except CheckpointException as e:    # raised on every rank when any rank's write failed
            raise _as_os_error(e, step_path / sub) from None
        files.update(hash_own_files(step_path, sub, rank))
    return files


def _as_os_error(e: BaseException, where: Path) -> OSError:
    """DCP's CheckpointException as the OSError of the first failing rank, so runner/checkpoint.py
    abandons the write on every rank as it does for a failed torch.save."""
    for rank, (exc, _trace) in sorted(getattr(e, "failures", {}).items()):
        if isinstance(exc, OSError):
            return OSError(exc.errno, f"rank {rank}: {exc.strerror or exc}", exc.filename or str(where))
        return OSError(0, f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", str(where))
    return OSError(0, str(e).splitlines()[0], str(where))


_METADATA_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                     ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
                     ("collections", "OrderedDict"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only what DCP's .metadata holds: torch.distributed.checkpoint.metadata classes,
    torch.Size, dtypes, layouts and paths. Anything else (os.system, eval, ...) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        import torch.distributed.checkpoint.metadata as dcp_metadata

        ok = ((module, name) in _METADATA_GLOBALS
              or (module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type))
              or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)))
        if not ok:
            raise pickle.UnpicklingError(f"global {module}.{name} is not DCP metadata")
        return super().find_class(module, name)


def check_metadata(dcp_dir: Path) -> Any:
    """The DCP directory's .metadata; a one-line PlanError when it is not plain DCP metadata."""
    path = dcp_dir / ".metadata"
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except Exception as e:  # noqa: BLE001 - any failure to read an untrusted file is the same refusal
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise PlanError(str(path), f"refused: it is not DCP checkpoint metadata ({why})",
                        "it is not a nanoplan checkpoint; move it out of the run dir, or use another --run-dir") from None


def load_shards(step_path: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Collective: load model and optimizer state from step_path/dcp (resharding as needed).

    Every tensor's global size and dtype in the .metadata is checked against the live state dict
    first (runner/state_check.py), the same on every rank, so a crafted checkpoint is refused on
    all of them (a PlanError naming the entry) before dcp.load reads anything."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from runner.state_check import dcp_problem

    metas = {sub: check_metadata(step_path / sub) for sub in (MODEL_DIR, OPTIM_DIR)}
    msd, osd = get_state_dict(model, optimizers)
    for sub, sd, what in ((MODEL_DIR, msd, "model"), (OPTIM_DIR, osd, "optimizer")):
        if (why := dcp_problem(metas[sub], flatten_state_dict(sd)[0], what)) is not None:
            raise PlanError(str(step_path / sub), why, f"it was not written by this plan's run, or was edited after; "
                            f"move {step_path.name} out of {step_path.parent} to resume from an earlier "
                            "checkpoint, or use another --run-dir")
    dcp.load(msd, checkpoint_id=step_path / MODEL_DIR)
    dcp.load(osd, checkpoint_id=step_path / OPTIM_DIR)
    set_state_dict(model, optimizers, model_state_dict=msd, optim_state_dict=osd)
