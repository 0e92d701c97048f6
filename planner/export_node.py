"""What a cluster node needs to run a plan of another trainer under `nanoplan run` (issue 32 #2).

A plan made with `estimate --trainer nanochat|torchtitan|deepspeed` models that trainer's step, so a
SkyPilot or SLURM job of it runs that trainer, supervised by `nanoplan run PLAN.json` (its budget
clock, launch ledger, checkpoint cadence and resume: docs/trainers.md), never nanoplan's own
`-m runner.train`. Per trainer, this module says how the trainer gets onto a node:

- nanochat is a checkout, not a package: `nanoplan run --trainer-dir "$NANOCHAT_DIR"`. The SkyPilot
  task clones karpathy/nanochat at the commit the plan models, makes its .venv with uv as its
  runs/speedrun.sh does (`uv venv`, `uv sync --extra gpu`), and downloads its data shards and trains
  its tokenizer into NANOCHAT_BASE_DIR (`python -m nanochat.dataset -n N`, `python -m scripts.tok_train`;
  runs/speedrun.sh at 00a562cf: "Approximately 350 shards are needed for 10B tokens of data"). A SLURM
  script expects that checkout on the shared filesystem and stops in one line without it.
- torchtitan and DeepSpeed are installed packages: the release the plan models (`pip install
  torchtitan==0.3.0`), or the commit (`pip install git+https://github.com/pytorch/torchtitan@SHA`).

The per-trainer facts are each trainer's (`Trainer.checkout`, `Trainer.node_data_setup` in planner/trainers/), so
the exporters never name a trainer. Pure Python.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.plan import Plan

if TYPE_CHECKING:
    from planner.trainers import Checkout

TRAINER_DIR = "@NANOPLAN_TRAINER_DIR@"     # placeholder in `nanoplan run` args: the shell variable below


@dataclass(frozen=True)
class TrainerNode:
    name: str
    version: str
    repo: str
    ref: str                       # a 40-hex commit, or "package==version"
    checkout: Checkout | None
    data_setup: Callable[[Plan], list[str]]   # the trainer's own data and tokenizer (Trainer.node_data_setup)

    @property
    def is_commit(self) -> bool:
        return re.fullmatch(r"[0-9a-f]{40}", self.ref) is not None

    def run_args(self) -> list[str]:
        """Extra `nanoplan run` words (a placeholder for the trainer dir, expanded by the shell)."""
        return ["--trainer-dir", TRAINER_DIR] if self.checkout else []

    def dir_var(self, default: str) -> list[str]:
        """`NANOCHAT_DIR="${NANOCHAT_DIR:-DEFAULT}"; export NANOCHAT_DIR` (none for an installed package)."""
        if self.checkout is None:
            return []
        v = self.checkout.env
        return [f'{v}="${{{v}:-{default}}}"', f"export {v}"]

    def placeholder(self) -> str:
        return f'"${self.checkout.env}"' if self.checkout else ""

    def skypilot_setup(self, plan: Plan) -> list[str]:
        """Setup lines: the trainer at the plan's version (and, for a checkout, its environment and data)."""
        if self.checkout is None:
            what = (f"git+https://github.com/{self.repo}@{self.ref}" if self.is_commit else self.ref)
            return [f"# {self.name} {self.version}, the version the plan models", f"pip install {shlex.quote(what)}"]
        c = self.checkout
        lines = [f"# {self.name} {self.version} ({self.repo}@{self.ref[:12]}), the commit the plan models; set {c.env}",
                 "# to use another place (sky launch --env ...)",
                 *self.dir_var("$HOME/" + self.name),
                 f'[ -d "${c.env}/.git" ] || git clone -q https://github.com/{self.repo} "${c.env}"',
                 f'git -C "${c.env}" fetch -q origin && git -C "${c.env}" checkout -q {self.ref}',
                 f'cd "${c.env}"',
                 *c.env_setup]
        return lines + self.data_setup(plan)

    def slurm_check(self) -> list[str]:
        """Lines that stop a SLURM job in one line when the trainer's checkout is missing."""
        if self.checkout is None:
            return [f"# {self.name} {self.version} ({self.ref}) must be installed in the environment activated above."]
        c = self.checkout
        return [f"# {self.name} {self.version}: a checkout of {self.repo} at {self.ref} on the shared filesystem, with its",
                f"# {c.setup_hint}.",
                *self.dir_var("$PWD/" + self.name),
                f'if [ ! -f "${c.env}/{c.marker}" ]; then',
                f'    echo "nanoplan: no {self.name} checkout at ${c.env}: clone https://github.com/{self.repo} there at '
                f'{self.ref[:12]} (or set {c.env}), then submit again" >&2',
                "    exit 2",
                "fi"]


def trainer_node(plan: Plan) -> TrainerNode | None:
    """The trainer a plan runs on a node; None for nanoplan's own runner."""
    from planner.trainers import trainer_for  # noqa: PLC0415

    ref = plan.request.trainer
    tr = trainer_for(ref)
    if tr is None:
        return None
    v = tr.version(ref.version)
    return TrainerNode(name=tr.name, version=v.key, repo=tr.repo, ref=v.ref, checkout=tr.checkout,
                       data_setup=tr.node_data_setup)
