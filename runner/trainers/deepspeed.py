"""A DeepSpeed script under `nanoplan run` (deepspeed==0.19.8; paths below are in that package).

DeepSpeed wraps your own training script (`train.py`, in --trainer-dir or the current directory), so part
of the contract is nanoplan's, and the script must keep it (docs/trainers.md has a 25-line example):

- nanoplan runs the plan's command, `deepspeed --num_gpus=N train.py --deepspeed --deepspeed_config
  RUN_DIR/ds_config.json` (the `deepspeed` of the script's environment), and appends
  `--steps E --save-every K --save-dir RUN_DIR/checkpoints` and, on a resume, `--load-tag global_stepS`.
  The script calls `engine.load_checkpoint(save_dir, tag)` when given a tag, trains until
  `engine.global_steps == E`, calls `engine.save_checkpoint(save_dir)` whenever `global_steps % K == 0` and
  at E, and exits.
- RUN_DIR/ds_config.json is the plan's config (planner/trainers/launch_files.py `deepspeed_config`) with
  `steps_per_print: 1` (so DeepSpeed prints every step) and the scheduler's `total_num_steps` = E.

What DeepSpeed itself does (deepspeed/runtime/engine.py):
- `save_checkpoint(save_dir)` writes `save_dir/global_step{N}/` (tag `global_step{global_steps}`): the model
  (`mp_rank_00_model_states.pt` from data-parallel rank 0; under ZeRO-3 every rank's
  `zero_pp_rank_{r}_mp_rank_00_model_states.pt`) and every rank's ZeRO optimizer partition
  (`bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt` with bf16), each by torch.save in place; then rank 0
  writes the `latest` file, without waiting for the other ranks' files. So `latest` can name an unfinished
  checkpoint: nanoplan never follows it, it passes the newest complete tag.
- the partitions are per data-parallel rank: a checkpoint resumes on the GPU count that wrote it
  (a universal checkpoint, deepspeed/checkpoint/ds_to_universal.py, is how DeepSpeed changes it).
- stopping: the launcher (deepspeed/launcher/launch.py) answers SIGTERM/SIGINT by killing its workers; no
  signal makes the script save. It stops at --steps, or the supervisor stops it (SIGKILL of its process
  tree) right after a complete save.
- its step line (`_report_progress`, every `steps_per_print` steps, stdout): `[2026-...] [INFO]
  [logging.py:107:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]`; the step is the
  number of optimizer steps done. A `loss=X` on the same line (the script's own) is read too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from planner.errors import PlanError
from planner.plan import Plan, atomic_write_text
from planner.trainers.launch_files import deepspeed_config, launch_argv
from runner.trainers.adapter import NUMBER, Adapter, Launch, StepLine, number, set_flags, trainer_program
from runner.trainers.files import torch_file_problem

STEP = re.compile(rf"\bstep=(\d+), skipped=\d+, lr=\[({NUMBER})?")
LOSS = re.compile(rf"\bloss[=:]\s*({NUMBER})")
STEP_DIR = re.compile(r"^global_step(\d+)$")
CONFIG = "ds_config.json"
SCRIPT = "train.py"


class Deepspeed(Adapter):
    name = "deepspeed"
    reshards = False
    step_dir_re, step_dir_name = STEP_DIR, "global_step{step}"      # save_checkpoint's tag (engine.py)
    stops_by = ("its step count (--steps, where the script saves and exits), or SIGKILL of its process tree right "
                "after a complete save: no signal makes a DeepSpeed script save")

    def refuse(self, plan: Plan, plan_path: str) -> None:
        if plan.hardware.nodes > 1:
            raise PlanError(plan_path, "nanoplan run supervises one node of DeepSpeed", "re-plan it on one node")

    def trainer_dir(self, given: str | None) -> Path | None:
        d = Path(given or ".").resolve()
        if not (d / SCRIPT).is_file():
            where = f"--trainer-dir {given}" if given else f"the current directory ({d})"
            raise PlanError("--trainer-dir", f"{where} holds no {SCRIPT}",
                            f"pass --trainer-dir DIR, the directory of your DeepSpeed {SCRIPT} (docs/trainers.md "
                            "says what it must do)")
        return d

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_dir(self, run_dir: Path) -> Path:
        return run_dir.resolve() / "checkpoints"

    def written_by(self, run_dir: Path, step: int) -> int | None:
        d = self.checkpoint_dir(run_dir) / f"global_step{step}"
        ranks = [int(m[1]) for p in d.glob("*zero_pp_rank_*_optim_states.pt")
                 if (m := re.search(r"zero_pp_rank_(\d+)_", p.name))]
        return max(ranks) + 1 if ranks else None

    def problem(self, run_dir: Path, step: int, world: int) -> str | None:
        d = self.checkpoint_dir(run_dir) / f"global_step{step}"
        if not d.is_dir():
            return "missing"
        names = [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
        names = [n if (d / n).exists() else n.removeprefix("bf16_") for n in names]
        if (d / "mp_rank_00_model_states.pt").exists():     # ZeRO-1/2: data-parallel rank 0 saves the model
            names.append("mp_rank_00_model_states.pt")
        else:                                                # ZeRO-3: each rank its partition of it
            names += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)]
        for n in names:
            why = torch_file_problem(d / n)
            if why:
                return f"{n}: {why}"
        return None

    def run_files(self, run_dir: Path) -> list[Path]:
        return [run_dir / CONFIG]

    # ---------------------------------------------------------------- launching
    def prepare(self, launch: Launch) -> None:
        cfg = deepspeed_config(launch.plan)
        cfg["steps_per_print"] = 1
        sched = cfg.get("scheduler", {}).get("params", {})
        if "total_num_steps" in sched:
            sched["total_num_steps"] = launch.end_step
        atomic_write_text(launch.run_dir / CONFIG, json.dumps(cfg, indent=2) + "\n")

    def command(self, launch: Launch) -> list[str]:
        plan = launch.plan
        req = plan.request.model_copy(update={"device_batch_size": plan.training.device_batch_size})
        argv = launch_argv(req, plan.hardware.nodes, plan.hardware.gpus_per_node, launch.end_step, launch.save_every)
        assert argv[0] == "deepspeed", argv
        values: dict[str, str | None] = {"--deepspeed_config": str(launch.run_dir.resolve() / CONFIG),
                                         "--steps": str(launch.end_step), "--save-every": str(launch.save_every),
                                         "--save-dir": str(self.checkpoint_dir(launch.run_dir))}
        if launch.resume_step:
            values["--load-tag"] = f"global_step{launch.resume_step}"
        return [trainer_program(launch.trainer_dir, "deepspeed"), *set_flags(argv[1:], values)]

    # ---------------------------------------------------------------- watching
    def parse(self, line: str, world: int) -> StepLine | None:
        m = STEP.search(line)
        if m is None:
            return None
        loss = LOSS.search(line)
        return StepLine(step=int(m[1]), lr=number(m[2]), loss=number(loss[1]) if loss else None)


ADAPTER = Deepspeed()
