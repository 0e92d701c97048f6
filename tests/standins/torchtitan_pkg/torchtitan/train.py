"""A stand-in for `python -m torchtitan.train`, for tests: it keeps torchtitan's contract, as read in the
package torchtitan==0.3.0 (the version nanoplan plans), and trains nothing (it sleeps a step at a time;
tests/standins/standin_files.py has its knobs). None of torchtitan's code is copied.

The contract it keeps (paths in that package):
- flags (config/manager.py, tyro): `--module M --config C` and `--section.key value` overrides; booleans as
  `--section.flag` / `--section.no-flag`; the activation-checkpoint subcommand `activation-checkpoint:MODE`;
  `--dump-folder` (default ./outputs). Run under torchrun (RANK, WORLD_SIZE); every rank logs.
- the loop (trainer.py `train`): loads a checkpoint (`--checkpoint.load-step`, default -1: the newest
  `step-N` with a `.metadata`, `_find_load_step`), logs "Training starts at step N+1", then while
  `step < training.steps`: step += 1, train, log the step line when `step == 1 or step % log_freq == 0`
  (components/metrics.py; colours; tps per device), save when `step % checkpoint.interval == 0` or at the
  last step (components/checkpointer/dcp.py `_should_save`), then "Training completed".
- the save (torch DCP, FileSystemWriter): `dump_folder/checkpoint/step-N/`, every rank writes its
  `__{rank}_0.distcp` in place, and once all are written rank 0 writes `.metadata.tmp` (a pickle naming
  the files) and renames it to `.metadata`. The last step's save holds the model only unless
  `--checkpoint.no-last-save-model-only`. Then rank 0 deletes the step dirs older than the newest
  `keep_latest_k` (a purge thread in torchtitan, file by file: a kill leaves a half-deleted dir).
- resume: reads the step's .metadata and its files; a model-only checkpoint cannot resume training.
- no signal handler: a signal ends it at once, and nothing makes it save.
"""

import datetime
import os
import pickle
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
from standin_files import chain, knob, weights_at  # noqa: E402

BOOLS = {"enable", "last-save-model-only", "enable-first-step-checkpoint", "enable-sequence-parallel", "disable-cuda-graphs"}


def parse(argv):
    """tyro's surface as nanoplan uses it: (values, booleans, subcommands); exit 2 on a malformed flag."""
    vals, flags, subs = {}, {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            if ":" not in a:
                print(f"error: unrecognized argument {a!r}", file=sys.stderr)
                sys.exit(2)
            subs.append(a)
            i += 1
            continue
        key = a[2:]
        last = key.rsplit(".", 1)[-1]
        if last in BOOLS or last.startswith("no-") and last[3:] in BOOLS:
            base = key.replace("no-", "") if last.startswith("no-") else key
            flags[base] = not last.startswith("no-")
            i += 1
            continue
        j = i + 1          # tyro takes every word up to the next flag or subcommand (betas: two floats)
        while j < len(argv) and not argv[j].startswith("--") and ":" not in argv[j]:
            j += 1
        if j == i + 1:
            print(f"error: {a} needs a value", file=sys.stderr)
            sys.exit(2)
        vals[key] = " ".join(argv[i + 1:j])
        i = j
    return vals, flags, subs


vals, flags, subs = parse(sys.argv[1:])
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
dump = vals.get("dump-folder", "./outputs")
folder = os.path.join(dump, vals.get("checkpoint.folder", "checkpoint"))
steps = int(vals.get("training.steps", 10000))
interval = int(vals.get("checkpoint.interval", 500))
keep = int(vals.get("checkpoint.keep-latest-k", 10))
log_freq = int(vals.get("metrics.log-freq", 10))
load_step = int(vals.get("checkpoint.load-step", -1))
enabled = flags.get("checkpoint.enable", False)
model_only_last = flags.get("checkpoint.last-save-model-only", True)
tokens = int(vals.get("training.local-batch-size", 1)) * int(vals.get("training.seq-len", 2048))
payload = int(knob("STANDIN_FILE_BYTES", 65536))


def log(msg):
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    print(f"[titan] {now} - root - INFO - {msg}")


def find_load_step():
    found = [int(m[1]) for n in (os.listdir(folder) if os.path.isdir(folder) else [])
             if (m := re.match(r"^step-(\d+)$", n)) and os.path.isfile(os.path.join(folder, n, ".metadata"))]
    return max(found) if found else -1


def save(step, x, model_only):
    d = os.path.join(folder, f"step-{step}")
    os.makedirs(d, exist_ok=True)
    name = f"__{rank}_0.distcp"
    state = pickle.dumps({"step": step, "x": x, "model_only": model_only}, protocol=2)
    size = len(state).to_bytes(8, "little") + state
    with open(os.path.join(d, name), "wb", buffering=0) as f:     # in place, chunk by chunk
        f.write(size)
        n = max(1, payload // 4096)
        for _ in range(n):
            f.write(b"\0" * 4096)
            time.sleep(knob("STANDIN_SAVE_S", 0.1) / n)
    want = len(size) + max(1, payload // 4096) * 4096
    if rank == 0:
        files = [f"__{r}_0.distcp" for r in range(world)]
        while not all(os.path.exists(os.path.join(d, n)) and os.path.getsize(os.path.join(d, n)) >= want
                      for n in files):
            time.sleep(0.01)
        meta = {"state_dict_metadata": {"model.x": "scalar"},
                "storage_data": {("model.x", r): {"relative_path": n, "offset": 0, "length": want}
                                 for r, n in enumerate(files)}}
        with open(os.path.join(d, ".metadata.tmp"), "wb") as f:
            pickle.dump(meta, f)
        os.rename(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))
        old = sorted(int(m[1]) for n in os.listdir(folder) if (m := re.match(r"^step-(\d+)$", n)))
        for s in old[:-keep] if keep > 0 else []:
            p = os.path.join(folder, f"step-{s}")
            for n in sorted(os.listdir(p)):
                os.unlink(os.path.join(p, n))
                time.sleep(0.01)
            os.rmdir(p)
    else:
        while not os.path.exists(os.path.join(d, ".metadata")):
            time.sleep(0.01)


time.sleep(knob("STANDIN_STARTUP_S", 0.3))
step, x = 0, 0
if enabled and os.path.isdir(folder):
    s = find_load_step() if load_step == -1 else load_step
    if s != -1:
        log(f"Loading the checkpoint from {os.path.join(folder, f'step-{s}')}.")
        with open(os.path.join(folder, f"step-{s}", ".metadata"), "rb") as f:
            pickle.load(f)
        with open(os.path.join(folder, f"step-{s}", "__0_0.distcp"), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            state = pickle.loads(f.read(n))
        assert not state["model_only"], "a model-only checkpoint holds no optimizer state to resume"
        step, x = state["step"], state["x"]
        assert step == s and x == weights_at(step), (step, s)
log(f"Training starts at step {step + 1}")
while step < steps:
    step += 1
    t0 = time.time()
    time.sleep(knob("STANDIN_STEP_S", 0.1))
    x = chain(x, step - 1)
    if step == 1 or step % log_freq == 0:
        tps = tokens / (time.time() - t0)
        log(f"\x1b[31mstep: {step:2}  \x1b[32mloss: {10.0 / (1 + step / 100):8.5f}  \x1b[33mgrad_norm: {1.0:7.4f}  "
            f"\x1b[36mmemory: {0.0:5.2f}GiB({0.0:.2f}%)  \x1b[34mtps: {round(tps):,}  \x1b[36mtflops: 0.00  "
            f"\x1b[35mmfu: 0.00%\x1b[39m")
    if enabled and (step % interval == 0 or step == steps):
        log("Saving the checkpoint.")
        save(step, x, model_only=step == steps and model_only_last)
if rank == 0:
    log("Sleeping 2 seconds for other ranks to complete")
    time.sleep(0.2)
log("Training completed")
