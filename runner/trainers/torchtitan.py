"""torchtitan under `nanoplan run` (the installed package, torchtitan==0.3.0; paths below are in it).

What the supervisor relies on:
- launch: the plan's `torchrun ... -m torchtitan.train --module llama3 --config NAME --section.key value ...`
  (torchtitan/config/manager.py, tyro), run by the Python of the environment torchtitan is installed in
  (--trainer-dir's .venv, else nanoplan's own). `--dump-folder RUN_DIR/torchtitan` puts its outputs in the
  run dir; `--metrics.log-freq 1` makes it print every step (components/metrics.py `should_log`).
- the step count: `--training.steps E` (trainer.py `should_continue_training`); at step E it saves with
  `last_step=True` and exits. Its LR schedule is built over E.
- checkpoints (components/checkpointer/dcp.py): `--checkpoint.interval K` saves when `step % K == 0`, into
  `dump_folder/checkpoint/step-{step}/` through torch DCP: each rank's `__R_I.distcp`, then `.metadata`
  (the checkpoint is complete once it exists, runner/trainers/files.py). The last step's save holds the
  model only by default (`last_save_model_only`), which cannot resume training: the supervisor passes
  `--checkpoint.no-last-save-model-only`. `keep_latest_k` (default 10) purges older step dirs on
  a background thread after a save: a kill during the purge leaves a half-deleted one, which the check of
  the files .metadata names catches. nanoplan passes max(2, the plan's keep_last) (it refuses 1).
- resume: it loads the newest `step-N` that has a `.metadata` by itself; the supervisor passes
  `--checkpoint.load-step S`, the newest one whose files are all there. DCP reshards, so a checkpoint
  resumes on any GPU count.
- stopping: it installs no signal handler (trainer.py), so no signal makes it save: it stops at
  `--training.steps`, or the supervisor stops it (SIGKILL of its process tree) right after a complete save.
- step lines (components/metrics.py `MetricsProcessor.log`, to stdout through its logger, with colours):
  `[titan] 2026-... - root - INFO - step:  1  loss: 12.25  grad_norm: 1.77  memory: 1.86GiB(2.35%)
  tps: 1,543  tflops: 0.11  mfu: 0.01%`; tps is per device (the model's dp ranks each process their own).
"""

from __future__ import annotations

import re
from pathlib import Path

from planner.errors import PlanError
from planner.plan import Plan
from planner.trainers.launch_files import launch_argv
from planner.trainers.torchtitan import V02
from runner.trainers.adapter import (
    NUMBER,
    Adapter,
    Launch,
    StepLine,
    number,
    set_flags,
    torchrun_prefix,
    trainer_python,
)
from runner.trainers.files import dcp_files, dcp_ranks

STEP = re.compile(rf"step:\s*(\d+)\s+loss:\s*({NUMBER})\s+grad_norm:.*?\btps:\s*({NUMBER})")
STEP_DIR = re.compile(r"^step-(\d+)$")


class Torchtitan(Adapter):
    name = "torchtitan"
    reshards = True
    step_dir_re, step_dir_name = STEP_DIR, "step-{step}"            # components/checkpoint.py's folder per step
    stops_by = ("its step count (--training.steps, where it saves and exits), or SIGKILL of its process tree right "
                "after a complete save: it has no signal handler, so no signal makes it save")

    def refuse(self, plan: Plan, plan_path: str) -> None:
        if plan.request.trainer.version == V02:
            raise PlanError(plan_path, "nanoplan run supervises torchtitan 0.3 and later (Python configs and "
                            "--section.key overrides); 0.2's job TOML is not supported",
                            "re-plan it with --trainer-version 0.3")
        if plan.hardware.nodes > 1:
            raise PlanError(plan_path, "nanoplan run supervises one node of torchtitan", "re-plan it on one node")

    def trainer_dir(self, given: str | None) -> Path | None:
        d = Path(given or ".").resolve()
        if given and not d.is_dir():
            raise PlanError("--trainer-dir", f"{given} is not a directory", "pass torchtitan's checkout (its ./assets)")
        return d

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_dir(self, run_dir: Path) -> Path:
        return run_dir.resolve() / "torchtitan" / "checkpoint"

    def run_files(self, run_dir: Path) -> list[Path]:
        return [run_dir / "torchtitan"]

    def problem(self, run_dir: Path, step: int, world: int) -> str | None:
        _, why = dcp_files(self.checkpoint_dir(run_dir) / f"step-{step}")
        return why

    def written_by(self, run_dir: Path, step: int) -> int | None:
        names, _ = dcp_files(self.checkpoint_dir(run_dir) / f"step-{step}")
        return dcp_ranks(names) if names else None

    # ---------------------------------------------------------------- launching
    def command(self, launch: Launch) -> list[str]:
        plan = launch.plan
        req = plan.request.model_copy(update={"device_batch_size": plan.training.device_batch_size})
        argv = launch_argv(req, plan.hardware.nodes, plan.hardware.gpus_per_node, launch.end_step, launch.save_every)
        cut = argv.index("-m")
        values: dict[str, str | None] = {
            "--dump-folder": str(launch.run_dir.resolve() / "torchtitan"),
            "--metrics.log-freq": "1",
            "--training.steps": str(launch.end_step),
            "--checkpoint.interval": str(launch.save_every),
            "--checkpoint.keep-latest-k": str(max(2, plan.request.keep_last)),   # 1 is refused: one may be mid-save
            "--checkpoint.no-last-save-model-only": None,    # the last save resumable too, like every other one
        }
        if launch.resume_step:
            values["--checkpoint.load-step"] = str(launch.resume_step)
        tail = argv[cut:]
        ac = [a for a in tail if a.startswith("activation-checkpoint:")]    # a tyro subcommand: stays last
        tail = set_flags([a for a in tail if a not in ac], values) + ac
        return [*torchrun_prefix(argv[:cut], trainer_python(launch.trainer_dir)), *tail]

    # ---------------------------------------------------------------- watching
    def parse(self, line: str, world: int) -> StepLine | None:
        m = STEP.search(line)
        if m is None:
            return None
        tps = number(m[3])
        return StepLine(step=int(m[1]), loss=number(m[2]), tokens_per_sec=tps * world if tps is not None else None)


ADAPTER = Torchtitan()
