"""A stand-in DeepSpeed training script, for tests: the script contract `nanoplan run` asks of a DeepSpeed
train.py (docs/trainers.md; runner/trainers/deepspeed.py), with what DeepSpeed itself does in it kept as
deepspeed==0.19.8 does it (paths in that package), and no training (it sleeps a step at a time;
tests/standins/standin_files.py has its knobs). None of DeepSpeed's code is copied.

- arguments: `--local_rank=R` (added by the launcher, deepspeed/launcher/launch.py), `--deepspeed
  --deepspeed_config FILE`, and nanoplan's `--steps E --save-every K --save-dir DIR [--load-tag TAG]`;
- `engine.load_checkpoint(DIR, tag)` (runtime/engine.py): reads `DIR/TAG/` (this rank's optimizer
  partition and the model), and fails when a file is missing or cut short; `global_steps` comes back;
- each step: `engine.step()` prints, when `global_steps % steps_per_print == 0` (ds_config), on rank 0,
  through DeepSpeed's logger (stdout, `[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s]
  %(message)s`): `[Rank 0] step=N, skipped=0, lr=[...], mom=[(0.9, 0.95)]`;
- `engine.save_checkpoint(DIR)` at every K-th step and at E (engine.py `save_checkpoint`): tag
  `global_step{N}`; data-parallel rank 0 writes `mp_rank_00_model_states.pt` (ZeRO-1/2) or every rank
  `zero_pp_rank_{r}_mp_rank_00_model_states.pt` (ZeRO-3), then every rank its
  `bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt` (bf16), each by torch.save in place; rank 0 copies
  zero_to_fp32.py into DIR and writes DIR/latest with the tag, without waiting for the other ranks' files;
- no signal handler: nothing makes it save.
"""

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), ".."))
from standin_files import chain, knob, read_torch_file, weights_at, write_torch_file  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=0)
p.add_argument("--deepspeed", action="store_true")
p.add_argument("--deepspeed_config", required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--save-every", type=int, required=True)
p.add_argument("--save-dir", required=True)
p.add_argument("--load-tag")
args = p.parse_args()
cfg = json.load(open(args.deepspeed_config))
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
stage = cfg.get("zero_optimization", {}).get("stage", 0)
bf16 = "bf16_" if cfg.get("bf16", {}).get("enabled") else ""
per_print = cfg.get("steps_per_print", 10)
lr = cfg["optimizer"]["params"]["lr"]


def log_dist(msg):
    if rank == 0:
        now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        print(f"[{now}] [INFO] [logging.py:107:log_dist] [Rank 0] {msg}")


def files(tag):
    d = os.path.join(args.save_dir, tag)
    model = (os.path.join(d, "mp_rank_00_model_states.pt") if stage < 3
             else os.path.join(d, f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"))
    return d, model, os.path.join(d, f"{bf16}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


time.sleep(knob("STANDIN_STARTUP_S", 0.3))
global_steps, x = 0, 0
if args.load_tag:
    d, model, optim = files(args.load_tag)
    m, o = read_torch_file(model), read_torch_file(optim)
    assert m["global_steps"] == o["global_steps"], (m, o)
    global_steps, x = m["global_steps"], m["x"]
    assert x == weights_at(global_steps)
    log_dist(f"Loading checkpoint {d}: global_steps={global_steps}")
while global_steps < args.steps:
    time.sleep(knob("STANDIN_STEP_S", 0.1))
    x = chain(x, global_steps)
    if (global_steps + 1) % per_print == 0:
        log_dist(f"step={global_steps + 1}, skipped=0, lr=[{lr}], mom=[(0.9, 0.95)]")
    global_steps += 1
    if global_steps % args.save_every == 0 or global_steps == args.steps:
        tag = f"global_step{global_steps}"
        d, model, optim = files(tag)
        os.makedirs(d, exist_ok=True)
        if stage == 3 or rank == 0:
            write_torch_file(model, {"global_steps": global_steps, "x": x})
        write_torch_file(optim, {"global_steps": global_steps, "x": x, "rank": rank})
        if rank == 0:
            with open(os.path.join(args.save_dir, "zero_to_fp32.py"), "w") as f:
                f.write("# DeepSpeed's recovery script\n")
            with open(os.path.join(args.save_dir, "latest"), "w") as f:
                f.write(tag)
