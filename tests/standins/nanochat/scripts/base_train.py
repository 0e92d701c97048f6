"""A stand-in for nanochat's `scripts/base_train.py`, for tests: it keeps nanochat's contract, as read at
karpathy/nanochat 92d63d4e8bb4df75c3b71618f31ddde2378b2bcd (2026-07-03), and trains nothing (it sleeps a
step at a time; tests/standins/standin_files.py has its knobs). None of nanochat's code is copied.

The contract it keeps (scripts/base_train.py, nanochat/checkpoint_manager.py, nanochat/common.py at that commit):
- its argparse flags with their defaults (`--num-iterations`, `--save-every`, `--resume-from-step`,
  `--model-tag`, `--device-type`, ...); run as `python -m scripts.base_train` from the checkout root, or
  under `torchrun` (RANK, WORLD_SIZE); only rank 0 prints (print0);
- the checkpoint dir `os.path.join(base_dir, "base_checkpoints", model_tag or f"d{depth}")`, base_dir
  `$NANOCHAT_BASE_DIR` else `~/.cache/nanochat`;
- the loop: `last_step = step == num_iterations`; at the top of each pass it saves when
  `last_step or (step > 0 and step != resume_from_step and save_every > 0 and step % save_every == 0)`,
  then breaks on last_step, else trains one step and prints
  `step {step:05d}/{num_iterations:05d} ({pct:.2f}%) | loss: ... | lrm: ... | dt: ...ms | tok/sec: ... |
  bf16_mfu: ... | epoch: ... | total time: ...m`. A resume with num_iterations below the resume step never
  ends (the equality is never met): so does this one;
- the save (checkpoint_manager.save_checkpoint): rank 0 writes `model_{step:06d}.pt` (torch.save) then
  `meta_{step:06d}.json` (json.dump, which writes `Infinity` for min_val_bpb = inf), each rank then its
  `optim_{step:06d}_rank{rank}.pt`: in place, no rename, no barrier; each "Saved ..." line goes to stderr
  through logging ('%(asctime)s - %(name)s - %(levelname)s - %(message)s');
- resume (`--resume-from-step S`): loads model_S, this rank's optim_S and meta_S, and fails with a
  traceback when one is missing or cut short;
- no signal handler: SIGTERM and SIGINT end it at once, and nothing makes it save;
- its prints are Python's own (no flush): without PYTHONUNBUFFERED they reach a file late.

A test's fault (not nanochat's): STANDIN_CRASH_ONCE=STEP:FILE raises at STEP unless FILE exists (then creates it).
"""

import argparse
import json
import logging
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
from standin_files import chain, knob, read_torch_file, weights_at, write_torch_file  # noqa: E402

parser = argparse.ArgumentParser(description="Pretrain base model")
parser.add_argument("--run", type=str, default="dummy")
parser.add_argument("--device-type", type=str, default="")
parser.add_argument("--fp8", action="store_true")
parser.add_argument("--fp8-recipe", type=str, default="tensorwise", choices=["rowwise", "tensorwise"])
parser.add_argument("--depth", type=int, default=20)
parser.add_argument("--aspect-ratio", type=int, default=64)
parser.add_argument("--head-dim", type=int, default=128)
parser.add_argument("--max-seq-len", type=int, default=2048)
parser.add_argument("--window-pattern", type=str, default="SSSL")
parser.add_argument("--num-iterations", type=int, default=-1)
parser.add_argument("--target-flops", type=float, default=-1.0)
parser.add_argument("--target-param-data-ratio", type=float, default=12)
parser.add_argument("--device-batch-size", type=int, default=32)
parser.add_argument("--total-batch-size", type=int, default=-1)
parser.add_argument("--embedding-lr", type=float, default=0.3)
parser.add_argument("--unembedding-lr", type=float, default=0.008)
parser.add_argument("--weight-decay", type=float, default=0.28)
parser.add_argument("--matrix-lr", type=float, default=0.02)
parser.add_argument("--scalar-lr", type=float, default=0.5)
parser.add_argument("--warmup-steps", type=int, default=40)
parser.add_argument("--warmdown-ratio", type=float, default=0.65)
parser.add_argument("--final-lr-frac", type=float, default=0.05)
parser.add_argument("--resume-from-step", type=int, default=-1)
parser.add_argument("--eval-every", type=int, default=250)
parser.add_argument("--eval-tokens", type=int, default=80 * 524288)
parser.add_argument("--core-metric-every", type=int, default=2000)
parser.add_argument("--core-metric-max-per-task", type=int, default=500)
parser.add_argument("--sample-every", type=int, default=2000)
parser.add_argument("--save-every", type=int, default=-1)
parser.add_argument("--model-tag", type=str, default=None)
args = parser.parse_args()

logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
logger = logging.getLogger("nanochat.checkpoint_manager")
rank = int(os.environ.get("RANK", 0))
world = int(os.environ.get("WORLD_SIZE", 1))


def print0(s=""):
    if rank == 0:
        print(s)


base_dir = os.environ.get("NANOCHAT_BASE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nanochat")
checkpoint_dir = os.path.join(base_dir, "base_checkpoints", args.model_tag if args.model_tag else f"d{args.depth}")
time.sleep(knob("STANDIN_STARTUP_S", 0.3))
print0(f"Distributed world size: {world}")

resuming = args.resume_from_step != -1
x, step = 0, 0
if resuming:
    print0(f"Resuming optimization from step {args.resume_from_step}")
    s = args.resume_from_step
    model = read_torch_file(os.path.join(checkpoint_dir, f"model_{s:06d}.pt"))
    optim = read_torch_file(os.path.join(checkpoint_dir, f"optim_{s:06d}_rank{rank:d}.pt"))
    with open(os.path.join(checkpoint_dir, f"meta_{s:06d}.json"), encoding="utf-8") as f:
        meta = json.load(f)
    step = meta["step"]
    assert model["step"] == optim["step"] == step == s, (model["step"], optim["step"], step, s)
    x = model["x"]
    assert x == weights_at(step), "resumed weights are not those of an uninterrupted run"

assert args.num_iterations > 0, "the stand-in needs --num-iterations"
num_iterations = args.num_iterations
total_batch_size = args.total_batch_size if args.total_batch_size > 0 else 524288
step_s = knob("STANDIN_STEP_S", 0.1)


def save_checkpoint(step):
    if rank == 0:
        os.makedirs(checkpoint_dir, exist_ok=True)
        path = os.path.join(checkpoint_dir, f"model_{step:06d}.pt")
        write_torch_file(path, {"step": step, "x": x})
        logger.info(f"Saved model parameters to: {path}")
        path = os.path.join(checkpoint_dir, f"meta_{step:06d}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"step": step, "val_bpb": None, "user_config": vars(args),
                       "loop_state": {"min_val_bpb": float("inf"), "smooth_train_loss": 0.0}}, f, indent=2)
        logger.info(f"Saved metadata to: {path}")
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, f"optim_{step:06d}_rank{rank:d}.pt")
    write_torch_file(path, {"step": step, "x": x, "rank": rank})
    logger.info(f"Saved optimizer state to: {path}")


total_time = 0.0
while True:
    last_step = step == num_iterations
    if last_step or (step > 0 and step != args.resume_from_step and args.save_every > 0
                     and step % args.save_every == 0):
        save_checkpoint(step)
    if last_step:
        break
    crash = os.environ.get("STANDIN_CRASH_ONCE", "")       # a test's fault: "STEP:MARKER" dies once at STEP
    if crash and step == int(crash.split(":")[0]) and not os.path.exists(crash.split(":", 1)[1]):
        open(crash.split(":", 1)[1], "w").close()
        raise RuntimeError(f"stand-in crash at step {step}")
    t0 = time.time()
    time.sleep(step_s)
    x = chain(x, step)
    dt = time.time() - t0
    total_time += dt
    loss = 10.0 * math.exp(-step / 500) + 1.0
    lrm = 1.0 if step < 0.35 * num_iterations else max(0.05, (num_iterations - step) / (0.65 * num_iterations))
    print0(f"step {step:05d}/{num_iterations:05d} ({100 * step / num_iterations:.2f}%) | loss: {loss:.6f} | "
           f"lrm: {lrm:.2f} | dt: {dt * 1000:.2f}ms | tok/sec: {int(total_batch_size / dt):,} | bf16_mfu: 0.00 | "
           f"epoch: 1 pq: 0 rg: 0 | total time: {total_time / 60:.2f}m")
    step += 1

print0("Peak memory usage: 0.00MiB")
print0(f"Total training time: {total_time / 60:.2f}m")
