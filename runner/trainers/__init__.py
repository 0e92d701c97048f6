"""Other trainers under `nanoplan run`: one adapter per trainer, one supervisor for all (no torch here).

- adapter.py: the interface (launch, checkpoints and when one is complete, resume, step lines);
- nanochat.py, torchtitan.py, deepspeed.py: the facts of each trainer, read from its source;
- supervise.py: the budget logic, written once (guard.py: its arithmetic; records.py: what the run dir
  keeps; keeper.py: the process that holds the trainer's tree; watch.py: its log and progress);
- files.py: whether a checkpoint file is whole, by its headers.

docs/trainers.md says how each trainer is stopped; docs/reliability.md what each survives.
"""

from __future__ import annotations

from importlib import import_module

from runner.trainers.adapter import Adapter

ADAPTERS = {"nanochat": "runner.trainers.nanochat", "torchtitan": "runner.trainers.torchtitan",
            "deepspeed": "runner.trainers.deepspeed"}


def adapter_for(name: str) -> Adapter:
    """The adapter of a plan's trainer (request.trainer.name); KeyError for nanoplan's own runner."""
    return import_module(ADAPTERS[name]).ADAPTER


__all__ = ["ADAPTERS", "Adapter", "adapter_for"]
