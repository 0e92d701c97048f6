"""Re-derive the shipped example plans with today's planner and re-export the cluster files from them.

    python scripts/render_examples.py

Run it after a change to the planner's numbers: tests/test_export.py (test_examples_are_up_to_date) and
tests/test_runner_cli.py hold examples/ to what the code writes today.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANS = ("examples/tiny/plan.json", "examples/cluster/plan.json")
EXPORTS = ((["--slurm"], "examples/cluster/job.sbatch"),
           (["--skypilot", "--bucket", "s3://my-bucket/nanoplan"], "examples/cluster/task.yaml"))


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from planner.build import build_plan, rederive
    from planner.plan import load_plan, save_plan
    from planner.profiles import find_profile

    for rel in PLANS:
        path = ROOT / rel
        plan = load_plan(path)
        req = plan.request.model_copy(update={"profile": find_profile(plan.request.profile.name)})  # today's profile
        fresh = build_plan(req, plan_path=rel)
        stale = rederive(plan, rel)[1] if plan.request.profile == req.profile else ["the profile"]
        save_plan(fresh, path)
        print(f"{rel}: rebuilt ({len(stale)} difference(s), first: {stale[0] if stale else '-'})")
    for args, out in EXPORTS:
        subprocess.run([sys.executable, "-m", "nanoplan", "export", "examples/cluster/plan.json", *args, "--out", out],
                       cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
