"""A stand-in for the `deepspeed` launcher, for tests (the real one takes ~17 s to start on the CI box): it
keeps the contract of deepspeed==0.19.8's deepspeed/launcher/runner.py and launch.py on one node, in one
level (the real runner starts launch.py, which starts the workers). None of DeepSpeed's code is copied.

- `deepspeed [--num_gpus=N] SCRIPT ARGS`: N workers `python -u SCRIPT --local_rank=R ARGS` (launch.py adds
  --local_rank unless --no_local_rank), with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, in
  the launcher's own session, each logged as `process PID spawned with command: [...]`;
- a worker that exits non-zero makes it kill the others and exit with that code; SIGTERM or SIGINT make it
  kill its workers and exit 1 (launch.py `sigkill_handler`): no worker is asked to save.
"""

import datetime
import os
import signal
import subprocess
import sys
import time


def log(msg):
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    print(f"[{now}] [INFO] [launch.py:245:main] {msg}", flush=True)


argv = sys.argv[1:]
n = 1
while argv and argv[0].startswith("--"):
    a = argv.pop(0)
    if a.startswith("--num_gpus"):
        n = int(a.split("=", 1)[1]) if "=" in a else int(argv.pop(0))
script, rest = argv[0], argv[1:]
procs = []
for r in range(n):
    env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    cmd = [sys.executable, "-u", script, f"--local_rank={r}", *rest]
    procs.append(subprocess.Popen(cmd, env=env))
    log(f"process {procs[-1].pid} spawned with command: {cmd}")


def kill_all(signum, frame):
    for p in procs:
        p.kill()
    sys.exit(1)


signal.signal(signal.SIGTERM, kill_all)
signal.signal(signal.SIGINT, kill_all)
while procs:
    for p in list(procs):
        rc = p.poll()
        if rc is None:
            continue
        if rc != 0:
            for q in procs:
                q.kill()
            sys.exit(rc)
        log(f"Process {p.pid} exits successfully.")
        procs.remove(p)
    time.sleep(0.1)
