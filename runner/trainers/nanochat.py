"""nanochat's `scripts/base_train.py` under `nanoplan run` (karpathy/nanochat at 92d63d4, 2026-07-03; the
2025-11 version, c6abcdf, has the same contract with configurator flags: `--save_every=N`).

What the supervisor relies on, as read in that commit:
- launch: `torchrun --standalone --nproc_per_node=N -m scripts.base_train -- FLAGS` from the checkout's root
  (runs/speedrun.sh); on a CPU one process, `python -m scripts.base_train --device-type=cpu FLAGS`
  (runs/runcpu.sh). Its own `.venv` (speedrun.sh's `uv venv`) is used when the checkout has one.
- the step count: `--num-iterations=E`. Its loop runs until `step == num_iterations`, saves there and
  exits; a resume with E below the resume step would never stop (`last_step` is never true), so the
  supervisor never launches one.
- checkpoints: `--save-every=K` saves when `step % K == 0` (never at the resume step) into
  `base_dir/base_checkpoints/<--model-tag or d{depth}>/` (checkpoint_manager.save_checkpoint): rank 0
  writes `model_{step:06d}.pt` then `meta_{step:06d}.json`, and every rank `optim_{step:06d}_rank{r}.pt`,
  each in place (torch.save, json.dump), with no barrier: a kill during a save leaves some of them, or a
  torn one. The supervisor passes the run dir's `checkpoints/` as an absolute `--model-tag` (os.path.join
  drops the base dir before an absolute part), so they land in RUN_DIR/checkpoints; nanochat's later
  stages find them with the same `--model-tag`. meta_*.json may hold `Infinity` (min_val_bpb).
- resume: `--resume-from-step=S` loads model_S, meta_S and this rank's optim_S_rank{r}: the optimizer
  state is per rank, so a checkpoint resumes only on the GPU count that wrote it.
- stopping: it installs no signal handler, so no signal makes it save (SIGTERM/SIGINT end it at once). It
  stops by itself at `--num-iterations`; the supervisor stops it earlier (SIGKILL of its process tree)
  only right after a complete save, or at the deadline.
- step lines (print0, stdout): `step 00010/00020 (50.00%) | loss: 8.313887 | lrm: 0.28 | dt: 44.21ms |
  tok/sec: 11,581 | bf16_mfu: 0.00 | epoch: 1 pq: 1 rg: 4 | total time: 0.00m`; the step printed is the
  0-based index of the step just done. "Saved ..." lines go to stderr (logging).
"""

from __future__ import annotations

import re
from pathlib import Path

from planner.errors import PlanError
from planner.plan import Plan
from planner.trainers.flags import NANOCHAT_FLAGS
from planner.trainers.launch_files import launch_argv
from planner.trainers.nanochat import CURRENT, FIRST
from runner.trainers.adapter import NUMBER, Adapter, Launch, StepLine, number, torchrun_prefix, trainer_python
from runner.trainers.files import json_file_problem, torch_file_problem

STEP = re.compile(rf"^step (\d+)/(\d+) \([^)]*\) \| loss: ({NUMBER}) \|.*?\| tok/sec: ({NUMBER})")
LRM = re.compile(rf"\| lrm: ({NUMBER}) \|")
FILE = re.compile(r"^(?:model|meta|optim)_(\d{6,})(?:_rank\d+)?\.(?:pt|json)$")


class Nanochat(Adapter):
    name = "nanochat"
    reshards = False
    stops_by = ("its step count (--num-iterations, where it saves and exits), or SIGKILL of its process tree right "
                "after a complete save: it has no signal handler, so no signal makes it save")

    def refuse(self, plan: Plan, plan_path: str) -> None:
        v = plan.request.trainer.version or CURRENT
        if v == FIRST:
            raise PlanError(plan_path, "nanochat 2025-10 saves only at the end of its run and cannot resume "
                            "(--save_every and --resume_from_step came in c6abcdf)",
                            "re-plan it with --trainer-version 2025-11 or 2026-07")
        if plan.hardware.nodes > 1:
            raise PlanError(plan_path, "nanochat runs on one node (torchrun --standalone)", "re-plan it on one node")

    def trainer_dir(self, given: str | None) -> Path | None:
        d = Path(given or ".").resolve()
        if not (d / "scripts" / "base_train.py").is_file():
            where = f"--trainer-dir {given}" if given else f"the current directory ({d})"
            raise PlanError("--trainer-dir", f"{where} holds no scripts/base_train.py",
                            "pass --trainer-dir PATH (a checkout of karpathy/nanochat, its tokenizer and data "
                            "prepared as in runs/speedrun.sh)")
        return d

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_dir(self, run_dir: Path) -> Path:
        return run_dir.resolve() / "checkpoints"

    def steps(self, run_dir: Path) -> list[int]:
        d = self.checkpoint_dir(run_dir)
        try:
            names = [p.name for p in d.iterdir()]
        except OSError:
            return []
        return sorted({int(m.group(1)) for n in names if (m := FILE.match(n))})

    def paths(self, run_dir: Path, step: int) -> list[Path]:
        d = self.checkpoint_dir(run_dir)
        return sorted(p for p in d.glob(f"*_{step:06d}*") if FILE.match(p.name) and int(FILE.match(p.name)[1]) == step)

    def written_by(self, run_dir: Path, step: int) -> int | None:
        ranks = [int(p.name.rsplit("rank", 1)[1].split(".")[0]) for p in self.paths(run_dir, step)
                 if p.name.startswith("optim_")]
        return max(ranks) + 1 if ranks else None

    def problem(self, run_dir: Path, step: int, world: int) -> str | None:
        d = self.checkpoint_dir(run_dir)
        names = [f"model_{step:06d}.pt", *(f"optim_{step:06d}_rank{r}.pt" for r in range(world))]
        for n in names:
            why = torch_file_problem(d / n)
            if why:
                return f"{n}: {why}"
        meta, why = json_file_problem(d / f"meta_{step:06d}.json")
        if why:
            return f"meta_{step:06d}.json: {why}"
        if meta is not None and meta.get("step") != step:
            return f"meta_{step:06d}.json: says step {meta.get('step')!r}"
        return None

    # ---------------------------------------------------------------- launching
    def command(self, launch: Launch) -> list[str]:
        plan = launch.plan
        req = plan.request.model_copy(update={"device_batch_size": plan.training.device_batch_size})
        argv = launch_argv(req, plan.hardware.nodes, plan.hardware.gpus_per_node, launch.end_step, launch.save_every)
        cut = argv.index("--") if "--" in argv else argv.index("scripts.base_train")
        flags = argv[cut + 1:]
        v = req.trainer.version or CURRENT
        extra: dict[str, object] = {"model_tag": str(self.checkpoint_dir(launch.run_dir))}
        if launch.resume_step:
            extra["resume_from_step"] = launch.resume_step
        cpu = plan.request.profile.kind == "cpu"
        if cpu:
            extra["device_type"] = "cpu"
        flags = _set(flags, extra, v)
        python = trainer_python(launch.trainer_dir)
        if cpu:     # runs/runcpu.sh: one process, no torchrun (on a CPU it joins no process group)
            return [python, "-m", "scripts.base_train", *flags]
        return [*torchrun_prefix(argv[:argv.index("-m")], python), "-m", "scripts.base_train", "--", *flags]

    # ---------------------------------------------------------------- watching
    def parse(self, line: str, world: int) -> StepLine | None:
        m = STEP.match(line)
        if m is None:
            return None
        lrm = LRM.search(line)
        return StepLine(step=int(m[1]) + 1, loss=number(m[3]), tokens_per_sec=number(m[4]), total=int(m[2]),
                        lr=number(lrm[1]) if lrm else None)


def _set(flags: list[str], values: dict[str, object], version: str) -> list[str]:
    """nanochat flags with `values` set, in the version's own form: `--resume-from-step=S` (argparse, 2026-07) or
    `--resume_from_step=S` (the configurator, 2025), each checked against the flags read at that version."""
    known = NANOCHAT_FLAGS[version]
    out = list(flags)
    for key, value in values.items():
        name = f"--{key.replace('_', '-')}" if version == CURRENT else key
        want = known.get(name)
        if want is None or not isinstance(value, want):
            raise ValueError(f"nanochat {version} has no flag {name} of type {type(value).__name__}")   # a bug
        flag = name if version == CURRENT else f"--{name}"
        out = [a for a in out if a.split("=", 1)[0] != flag] + [f"{flag}={value}"]
    return out


ADAPTER = Nanochat()
