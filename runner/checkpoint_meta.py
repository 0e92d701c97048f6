"""A checkpoint's meta.json: read, checked against its schema and its own checksum, the files it
lists verified, and compared with a plan to say whether that plan may resume it.

Plain Python (no torch): `nanoplan run`'s preflight uses it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.errors import echo
from planner.plan import RESUME_SAFE_FIELDS, Plan, budget_key, doc_sha, flatten, plan_doc
from runner.checkpoint_layout import META, SHARDED_MODEL
from runner.runfiles import CheckpointMeta, problem_of, read_json_file, seal
from runner.torch_files import sha256_file

# RESUME_SAFE_FIELDS: what a resumed run may change (cadence, keep_last); train_hash is planner.plan.budget_key.
train_hash = budget_key


RESUME_HINT = ("only checkpoint_every_minutes and keep_last may change on resume; "
               "use another --run-dir, or --force to resume from it anyway")


def resume_mismatch(meta: dict[str, Any], plan: Plan) -> str | None:
    """Why a checkpoint (its meta.json) is of a different plan, as text to follow "... a different plan": the
    fields that differ, or the hashes for an old checkpoint. None when it can be resumed: the same plan, or one that differs only in RESUME_SAFE_FIELDS (cadence, keep_last)."""
    ours = plan_doc(plan)
    if meta.get("plan_hash") == doc_sha(ours) or meta.get("train_hash") == train_hash(ours):
        return None
    theirs = meta.get("plan")
    if not isinstance(theirs, dict):    # a checkpoint written before meta.json kept the plan's fields
        return (f" (hash {str(meta.get('plan_hash'))[:12]}, this plan {doc_sha(ours)[:12]}; the checkpoint predates "
                "the record of the plan's fields in meta.json, so the ones that differ cannot be named)")
    a, b = flatten(theirs), flatten(ours)
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k, "(absent)") != b.get(k, "(absent)")
            and k not in RESUME_SAFE_FIELDS]
    if not diff:
        return None
    first = diff[0]
    more = f" (and {len(diff) - 1} more: {', '.join(diff[1:4])}{', ...' if len(diff) > 4 else ''})" if len(diff) > 1 else ""
    return (f": {first} is {echo(a.get(first, '(absent)'), 80)} there, "
            f"{echo(b.get(first, '(absent)'), 80)} in this plan{more}")


def read_meta(path: Path) -> dict[str, Any] | None:
    """meta.json as stored, unchecked (None when absent or not JSON); check_meta validates it."""
    try:
        return json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_meta(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(meta, "ok") when meta.json parses, fits its schema and matches its own checksum; else (None, why),
    naming the field. A format-1 meta.json (before meta_sha256) is accepted without the checksum."""
    data, problem = read_json_file(path / META)
    if data is None:
        return None, "no readable meta.json (the write did not finish)" if problem is None else problem
    meta, problem = problem_of(CheckpointMeta, data, str(path / META))
    if problem is not None or meta is None:
        return None, problem or "invalid"
    stamp = data.get("meta_sha256")
    if (stamp is not None or data.get("format_version", 1) >= 2) and stamp != seal(data)["meta_sha256"]:
        return None, (f"{path / META}: field 'meta_sha256': does not match the file's content "
                      "(edited or damaged after it was written)")
    return data, "ok"


def verify(path: Path) -> tuple[bool, str]:
    """(ok, reason): meta.json valid (schema and its own checksum), every listed file present with its checksum."""
    meta, why = check_meta(path)
    if meta is None:
        return False, why
    files = meta["files"]
    if not ({"model.pt", SHARDED_MODEL} & set(files)):
        return False, "meta.json lists no model.pt (nor DCP model shards)"
    for name, info in files.items():
        f = path / name
        if not f.is_file():
            return False, f"{name} is missing"
        if f.stat().st_size != info.get("bytes"):
            return False, f"{name} has {f.stat().st_size} bytes, meta.json says {info.get('bytes')}"
        if sha256_file(f) != info.get("sha256"):
            return False, f"{name} fails its sha256 check"
    return True, "ok"
