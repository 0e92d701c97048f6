"""Hostile inputs, round two (issue 14, items 1, 8, 9, 10).

1. Control characters in a plan's strings are refused (exit 2, the field named), and no printable
   string, however hostile, makes an exported sbatch script or SkyPilot YAML run anything: the shell
   words of the script and the YAML's keys and values are those of a benign plan with the value put in.
8. The data files are fingerprinted (size + sampled sha256) in the run and checked on resume; odd-sized
   .bin files and token ids >= vocab are one-line errors naming the file.
9. Hand-edited run files (metrics.jsonl, run_info.json, best.json, a checkpoint's meta.json) are
   validated on read; the file and field are named.
10. Duplicate JSON keys are refused, echoes are cut, and a plan that differs only in its checkpoint
   cadence or keep_last resumes (any other difference names the field).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from planner.build import build_plan
from planner.errors import PlanError, control_char
from planner.export import SKYPILOT_MOUNT, _under, skypilot_task, slurm_script
from planner.plan import Plan, PlanRequest, load_plan
from planner.profiles import find_profile
from planner.spec import nanochat
from runner.data import REDO
from tests.conftest import REPO, TEXT, make_tiny_plan, nanoplan_no_launch, runner_env, write_data_dir

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BENIGN = "PLACEHOLDERQZX"


nanoplan = nanoplan_no_launch   # tests/conftest.py


# ---------------------------------------------------------------- 1. export injection

@pytest.fixture(scope="module")
def gpu_plan_doc() -> dict[str, Any]:
    req = PlanRequest(gpu="2x8xH100", profile=find_profile("H100"), model=nanochat(12), hours=2.0,
                      data_dir="data/tiny", run_dir="runs/a")
    return json.loads(build_plan(req, plan_path="plan.json").model_dump_json())


def _string_leaves(doc: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _string_leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _string_leaves(v, (*path, i))]
    return [path] if isinstance(doc, str) else []


def _put(doc: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


def test_the_issue_payload_is_refused_by_export(tmp_path: Path, gpu_plan_doc: dict) -> None:
    doc = json.loads(json.dumps(gpu_plan_doc))
    doc["launch"]["run_dir"] = "runs/x\ntouch /tmp/PWNED\n#"
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    for flag in (["--slurm"], ["--skypilot", "--bucket", "s3://b/p"]):
        code, out, err = nanoplan("export", "plan.json", *flag, cwd=tmp_path)
        assert code == 2 and out == "", err
        assert err.splitlines()[0].startswith("error: plan.json: field 'launch.run_dir': holds a control character")
        assert len(err.splitlines()) == 2 and "Traceback" not in err


@pytest.mark.parametrize("ch", ["\n", "\r", "\x00", "\t", "\x1b", "\x7f", "\x85", "\x9b", "\u2028"])
def test_every_string_field_refuses_control_characters(tmp_path: Path, gpu_plan_doc: dict, ch: str) -> None:
    """Each string of the plan (paths, names, list items, the profile's and spec's strings) in turn."""
    leaves = _string_leaves(gpu_plan_doc)
    assert len(leaves) > 20 and ("request", "profile", "name") in leaves and ("launch", "command", 3) in leaves
    for path in leaves:
        doc = json.loads(json.dumps(gpu_plan_doc))
        _put(doc, path, "a" + ch + "b")
        (tmp_path / "plan.json").write_text(json.dumps(doc))
        code, out, err = nanoplan("validate", "plan.json", cwd=tmp_path)
        assert code == 2, (path, err)
        first = err.splitlines()[0]
        # the field is named: its own dotted path, or its model's path and the path inside that model
        m = re.search(r"field '([^']*)': (?:'([^']*)' )?holds a control character", first)
        assert m, first
        named = m[1] + ("." + m[2] if m[2] else "")
        assert named == ".".join(str(p) for p in path), first


def test_cli_arguments_with_control_characters_are_refused(tmp_path: Path, gpu_plan_doc: dict) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_doc))
    plan = load_plan(tmp_path / "plan.json")
    for call in (lambda: slurm_script(plan, "plan.json\ntouch x"), lambda: slurm_script(plan, "p.json", run_dir="/s\rx"),
                 lambda: slurm_script(plan, "p.json", partition="gpu\x00"),
                 lambda: skypilot_task(plan, "plan.json", bucket="s3://b/\nsetup: x")):
        with pytest.raises(PlanError, match="control character|one plain word"):
            call()
    code, _, err = nanoplan("export", "plan.json", "--slurm", "--account", "a;touch x", cwd=tmp_path)
    assert code == 2 and "--account: must be one plain word" in err


def _words(script: str) -> list[str]:
    """The shell words bash would see in a script (comments dropped), with every `bash -c` body split too."""
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|<>()")
    lex.whitespace_split = True
    lex.commenters = "#"
    out: list[str] = []
    prev = ""
    for w in lex:
        if prev == "-c":    # bash -c 'BODY': a script of its own
            out += ["<c>", *_words(w.replace("\\\n", " ")), "</c>"]
        else:
            out.append(w)
        prev = w
    return out


def _hostile_plan(doc: dict, value: str) -> Plan:
    d = json.loads(json.dumps(doc))
    d["launch"]["run_dir"] = d["request"]["run_dir"] = value
    d["request"]["data_dir"] = value
    d["model"]["name"] = value
    return Plan.model_validate(d)


SHELL_CHARS = list(" '\"$`;&|<>(){}[]*?!#~\\=:,-./%@^+") + ["$(touch PWNED)", "`id`", "${IFS}", "'\"'\"'", "a", "Z", "0",
                                                          "é", "\u00a0", "\ufeff", "- ", ": ", "!!python/object"]
hostile = st.lists(st.sampled_from(SHELL_CHARS), min_size=1, max_size=12).map("".join).filter(
    lambda s: s.strip() != "" and control_char(s) is None)


@SETTINGS
@given(value=hostile)
@example(value=".")   # a run dir joined by a path library came out as "torchrun", not "./torchrun"
@example(value="-")   # a value that looks like a flag was put on a line of its own
def test_slurm_export_runs_nothing_but_the_command(gpu_plan_doc: dict, value: str) -> None:
    """The hostile script's shell words are exactly the benign script's with the value put in: no word,
    comment or line is added, and the value is always one whole word (or inside one quoted comment)."""
    bad = slurm_script(_hostile_plan(gpu_plan_doc, value), "plan.json")
    good = slurm_script(_hostile_plan(gpu_plan_doc, BENIGN), "plan.json")
    assert len(bad.splitlines()) == len(good.splitlines())
    for b, g in zip(bad.splitlines(), good.splitlines(), strict=True):
        assert b.startswith("#") == g.startswith("#"), (b, g)
    assert _words(bad) == [w.replace(BENIGN, value) for w in _words(good)]
    assert subprocess.run(["bash", "-n"], input=bad, text=True, capture_output=True).returncode == 0


@SETTINGS
@given(value=hostile)
@example(value=".")
@example(value="-")
def test_skypilot_export_yields_only_the_expected_keys_and_values(gpu_plan_doc: dict, value: str) -> None:
    bucket = "s3://bucket/" + value
    bad_text = skypilot_task(_hostile_plan(gpu_plan_doc, value), "plan.json", bucket=bucket)
    good_text = skypilot_task(_hostile_plan(gpu_plan_doc, BENIGN), "plan.json", bucket="s3://bucket/" + BENIGN)
    bad, good = yaml.safe_load(bad_text), yaml.safe_load(good_text)
    assert list(bad) == ["name", "workdir", "num_nodes", "resources", "envs", "file_mounts", "setup", "run"]
    assert bad["file_mounts"] == {SKYPILOT_MOUNT: {"source": bucket, "mode": "MOUNT_CACHED"}}
    for key in ("workdir", "num_nodes", "resources", "envs", "setup"):
        assert bad[key] == good[key]
    assert bad["name"].startswith("nanoplan-") and shlex.quote(bad["name"]) == bad["name"]
    rd_bad, rd_good = _under(SKYPILOT_MOUNT, value), _under(SKYPILOT_MOUNT, BENIGN)
    assert _words(bad["run"]) == [w.replace(rd_good, rd_bad) for w in _words(good["run"])]
    head = [line for line in bad_text.splitlines() if line and not line[0].isspace()]
    comments = [line for line in head if line.startswith("#")]
    assert len(comments) == len([g for g in good_text.splitlines() if g.startswith("#")])
    assert [line.split(":")[0] for line in head if not line.startswith("#")] == list(bad)   # no other top-level line


# ---------------------------------------------------------------- a finished one-process run to resume

def _train(plan: Path, run: Path, *extra: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(plan), "--run-dir", str(run), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=runner_env())


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(plan, run dir, data dir) of a 2-step one-process run with checkpoints, its own copy of the data."""
    d = tmp_path_factory.mktemp("finished")
    data = write_data_dir(d / "data", TEXT.read_bytes())
    plan = make_tiny_plan(d / "plan.json", data, steps=2, gpus=1, hyper={"val_every_steps": 1})
    r = _train(plan, d / "run")
    assert r.returncode == 0, r.stderr[-3000:]
    return plan, d / "run", data


@pytest.fixture
def fresh(tmp_path: Path, finished: tuple[Path, Path, Path]) -> tuple[Path, Path, Path]:
    """(the plan, a copy of the finished run, a copy of its data). The plan still names the original data dir
    (it is part of the plan); `decide` is given the copy, which the tests may damage."""
    plan, run, data = finished
    shutil.copytree(data, tmp_path / "data")
    shutil.copytree(run, tmp_path / "run")
    return plan, tmp_path / "run", tmp_path / "data"


def decide(plan: Path, run: Path, data: Path, force: bool = False) -> tuple[dict[str, Any], list[str]]:
    """runner.train's resume decision (rank 0), in-process: (decision, log lines)."""
    from runner.clock import Clock
    from runner.data import data_fingerprints
    from runner.resume import decide_resume

    msgs: list[str] = []
    p = load_plan(plan)
    decision = decide_resume(p, "", run, False, force, msgs.append, Clock.from_env(), data, data_fingerprints(data))
    return decision, msgs


def the_error(decision: dict[str, Any]) -> str:
    assert "error" in decision, decision
    field, problem, fix = decision["error"]
    return f"{field}: {problem}"


# ---------------------------------------------------------------- 8. the data

def test_resume_on_replaced_or_truncated_data_is_refused(fresh: tuple[Path, Path, Path]) -> None:
    plan, run, data = fresh
    assert "error" not in decide(plan, run, data)[0]
    train = data / "train.bin"
    body = bytearray(train.read_bytes())
    body[100:110] = bytes(10)                      # same size, other content
    train.write_bytes(bytes(body))
    assert the_error(decide(plan, run, data)[0]) == (
        f"{train}: changed since the checkpoint was written (its sha256, full, differs) (checkpoint step_00000002)")
    train.write_bytes(bytes(body[: len(body) // 2]))   # truncated (whole tokens)
    assert the_error(decide(plan, run, data)[0]).startswith(f"{train}: has {len(body) // 2:,} bytes, {len(body)} when")
    d, msgs = decide(plan, run, data, force=True)
    assert "error" not in d and any("resuming on it anyway (--force)" in m for m in msgs)


def test_the_fingerprint_samples_a_large_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner import data as rd

    monkeypatch.setattr(rd, "FULL_CHECK_MAX_BYTES", 1 << 16)
    monkeypatch.setattr(rd, "SAMPLE_BLOCK_BYTES", 1 << 10)
    f = tmp_path / "big.bin"
    f.write_bytes(bytes(range(256)) * 4096)         # 1 MiB: 64 blocks of 1 KiB are read
    a = rd.fingerprint(f)
    assert a["method"] == "sampled:64x1024" and a["bytes"] == 1 << 20
    with open(f, "r+b") as h:                        # a change inside the last block is seen
        h.seek((1 << 20) - 5)
        h.write(b"x")
    assert rd.fingerprint(f)["sha256"] != a["sha256"]


@pytest.mark.parametrize("damage,says", [
    (lambda b: b + b"\x01", "has {n:,} bytes, not a whole number of uint16 tokens (2 bytes each); it is truncated or "
                            "not a token file"),
    (lambda b: b[:-2], "holds {t:,} tokens, but meta.json says {m:,}"),
    (lambda b: b[:10] + (300).to_bytes(2, "little") + b[12:], "holds token id 300 at token 5, but the vocab has 256 ids "
                                                               "(meta.json); the embedding has no row for it"),
])
def test_bad_token_files_are_one_line_errors_without_restarts(tmp_path: Path, tiny_plan, damage, says: str) -> None:
    """Through `nanoplan run` (torchrun, max 3 restarts): exit 2 at once, one error line naming the file."""
    data = write_data_dir(tmp_path / "data", TEXT.read_bytes())
    train = data / "train.bin"
    before = train.read_bytes()
    train.write_bytes(damage(before))
    plan = make_tiny_plan(tmp_path / "plan.json", data, steps=2, gpus=1)
    n = train.stat().st_size
    expected = says.format(n=n, t=n // 2, m=len(before) // 2)
    if "not a whole number" in says or "token id" in says:
        r = _train(plan, tmp_path / "run")                   # the worker itself: exit 2, no traceback
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.splitlines()[-1] == f"error: {train}: {expected} ({REDO})", r.stderr[-1000:]
    else:                                                    # the real launcher: torchrun does not restart it
        r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
        errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert r.returncode == 2 and errors == [f"error: {train}: {expected} ({REDO})"], r.stderr[-3000:]
        said = [x for x in (r.stdout + r.stderr).splitlines() if not x.startswith("launching:")]
        assert "Traceback" not in r.stderr and not any("restart" in x.lower() for x in said), r.stderr[-3000:]


def test_prepare_data_refuses_token_ids_outside_the_vocab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from runner import prepare
    from runner.tokenize import ByteTokenizer

    class Wrong:
        def feed(self, data: bytes) -> np.ndarray:
            return np.full(len(data), 300, dtype=np.uint32)

        def finish(self) -> np.ndarray:
            return np.zeros(0, dtype=np.uint32)

    monkeypatch.setattr(ByteTokenizer, "stream", lambda self: Wrong())
    src = tmp_path / "in.txt"
    src.write_text("hello world " * 100)
    with pytest.raises(PlanError) as e:
        prepare.prepare_data([str(src)], tmp_path / "out", "byte")
    assert str(e.value).startswith(f"{tmp_path / 'out' / 'train.bin'}: the byte tokenizer produced token id 300")
    assert not (tmp_path / "out" / "train.bin").exists() and not (tmp_path / "out" / "meta.json").exists()


# ---------------------------------------------------------------- 9. hand-edited run files

def _edit_json(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_hand_edited_meta_json_is_caught_and_named(fresh: tuple[Path, Path, Path]) -> None:
    from runner.checkpoint_layout import step_dir
    from runner.checkpoint_meta import verify

    plan, run, data = fresh
    meta = step_dir(run, 2) / "meta.json"
    _edit_json(meta, lambda d: d.update(elapsed_hours=float("nan")))        # json.dumps writes NaN
    assert verify(meta.parent) == (False, f"{meta}: field 'elapsed_hours': Input should be a finite number")
    _edit_json(meta, lambda d: d.update(elapsed_hours=0.5))                  # well-typed, but not what was written
    assert verify(meta.parent)[1] == (f"{meta}: field 'meta_sha256': does not match the file's content "
                                      "(edited or damaged after it was written)")
    d, msgs = decide(plan, run, data)                     # falls back to step 1, saying why; step 2 is set aside
    assert d["step"] == 1 and any("step_00000002 is not usable: " in m and "meta_sha256" in m for m in msgs)
    assert (run / "checkpoints" / ".damaged" / "step_00000002" / "meta.json").is_file()
    _edit_json(step_dir(run, 1) / "meta.json", lambda d: d.update(step="one"))
    assert the_error(decide(plan, run, data)[0]) == (
        f"--run-dir: {run} holds checkpoints but none is intact (the newest, step_00000001: "
        f"{step_dir(run, 1) / 'meta.json'}: field 'step': Input should be a valid integer)")


def test_a_sealed_meta_json_still_verifies(fresh: tuple[Path, Path, Path]) -> None:
    """The seal is the canonical JSON, so reformatting the file (indent, key order) is not damage."""
    from runner.checkpoint_layout import step_dir
    from runner.checkpoint_meta import verify

    _, run, _ = fresh
    meta = step_dir(run, 2) / "meta.json"
    doc = json.loads(meta.read_text())
    meta.write_text(json.dumps(dict(reversed(list(doc.items())))))
    assert verify(meta.parent) == (True, "ok")


@pytest.mark.parametrize("change,says", [
    (lambda d: d["segments"][0].update(carried_hours="lots"), "field 'segments.0.carried_hours': Input should be a valid number"),
    (lambda d: d["segments"][0].update(clock_start_unix=float("nan")), "field 'segments.0.clock_start_unix': Input should be a finite number"),
    (lambda d: d.update(segments={"0": 1}), "field 'segments': Input should be a valid list"),
])
def test_a_bad_run_info_json_stops_the_run_naming_the_field(fresh: tuple[Path, Path, Path], change, says: str) -> None:
    plan, run, data = fresh
    _edit_json(run / "run_info.json", change)
    assert the_error(decide(plan, run, data)[0]).startswith(f"{run / 'run_info.json'}: {says}")


def test_a_bad_best_json_is_ignored_with_a_warning_and_rewritten(fresh: tuple[Path, Path, Path]) -> None:
    from runner.checkpoint_retention import read_best, retain, update_best

    plan, run, data = fresh
    (run / "best.json").write_text(json.dumps({"step": "2", "val_loss": "low", "path": "x"}))
    d, msgs = decide(plan, run, data)
    assert d["step"] == 2
    assert f"warning: {run / 'best.json'}: field 'step': Input should be a valid integer (+1 more); ignored" in msgs[0]
    assert read_best(run) is None
    assert update_best(run, 2, 1.5) and read_best(run) == {"step": 2, "val_loss": 1.5, "path": "checkpoints/step_00000002"}
    assert retain(run, 1) == [1]


def test_metrics_lines_torn_are_skipped_corrupt_are_named(fresh: tuple[Path, Path, Path]) -> None:
    from runner.metrics import read_metrics

    plan, run, data = fresh
    m = run / "metrics.jsonl"
    good = m.read_text().splitlines()
    lines = [good[0], '{"step": 7, "loss": 3.1, "elapsed_ho',      # torn by a kill, then a resume appended
             '{"step": 1, "elapsed_hours": "abc"}',                   # a wrong type
             '[1, 2]', 'garbage', '{"step": 1, "step": 2}', good[1], '{"step": 3, "lo']   # ... and a torn last line
    m.write_text("\n".join(lines))
    warnings: list[str] = []
    rows = read_metrics(run, warn=warnings.append)
    assert [r["step"] for r in rows] == [1, 2]
    assert warnings == [
        f"{m}:3: field 'elapsed_hours': Input should be a valid number, unable to parse string as a number; line skipped",
        f"{m}:4: must hold a JSON object, not list; line skipped",
        f"{m}:5: is not valid JSON (Expecting value at column 1); line skipped",
        f"{m}: 1 more bad lines skipped",
    ]
    d, msgs = decide(plan, run, data)                                # the run resumes, saying which lines it skipped
    assert d["step"] == 2 and sum("line skipped" in x for x in msgs) == 3


# ---------------------------------------------------------------- 10. small ones

def test_duplicate_keys_in_a_plan_are_refused(tmp_path: Path, gpu_plan_doc: dict) -> None:
    text = json.dumps(gpu_plan_doc).replace('"keep_last": 3', '"keep_last": 3, "keep_last": 300', 1)
    assert text.count('"keep_last"') == 3
    (tmp_path / "plan.json").write_text(text)
    code, _, err = nanoplan("validate", "plan.json", cwd=tmp_path)
    assert code == 2
    assert err.splitlines()[0] == ("error: plan.json: is not a plan: the key 'keep_last' appears twice in one object "
                                   "(JSON keeps only the last one)")


def test_huge_values_are_not_echoed_whole(tmp_path: Path, gpu_plan_doc: dict) -> None:
    for where in (("schema_version",), ("request", "decay"), ("request", "hyper", "decay")):
        doc = json.loads(json.dumps(gpu_plan_doc))
        _put(doc, where, "x" * 5_000_000)
        (tmp_path / "plan.json").write_text(json.dumps(doc))
        code, out, err = nanoplan("validate", "plan.json", cwd=tmp_path)
        assert code == 2 and len(err) < 1500, (where, len(err))
    code, _, err = nanoplan("export", "plan.json", "--slurm", "--partition", "p " * 1_000_000, cwd=tmp_path)
    assert code == 2 and len(err) < 1500


def test_resume_allows_cadence_and_keep_last_and_names_any_other_field(fresh: tuple[Path, Path, Path]) -> None:
    from runner.preflight import check_resume

    plan, run, data = fresh
    doc = json.loads(plan.read_text())
    safe = make_tiny_plan(run.parent / "safe.json", doc["request"]["data_dir"], steps=2, gpus=1, hyper={"val_every_steps": 1},
                          checkpoint_every_minutes=7.5, keep_last=9)
    assert check_resume(load_plan(safe), run, True) is None
    assert "error" not in decide(safe, run, data)[0]
    other = make_tiny_plan(run.parent / "other.json", doc["request"]["data_dir"], steps=2, gpus=1, hyper={"val_every_steps": 1, "lr": 1e-3},
                           checkpoint_every_minutes=7.5)
    line = check_resume(load_plan(other), run, True)
    assert line == (f"{run} holds checkpoints of a different plan: request.hyper.lr is 0.003 there, 0.001 in this plan; "
                    "only checkpoint_every_minutes and keep_last may change on resume; use another --run-dir, or "
                    "--force to resume from it anyway")
    assert the_error(decide(other, run, data)[0]).startswith(
        "--run-dir: checkpoint step_00000002 was made by a different plan: request.hyper.lr is 0.003 there")
    assert doc["request"]["hyper"]["lr"] == 0.003
    r = _train(safe, run)                                            # end to end: it resumes, then stops at total_steps
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr[-2000:]
