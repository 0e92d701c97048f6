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

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner.cli as cli
from planner.build import build_plan
from planner.errors import PlanError, control_char
from planner.export import SKYPILOT_MOUNT, _under, skypilot_task, slurm_script
from planner.plan import Plan, PlanRequest, load_plan
from planner.profiles import find_profile
from planner.spec import nanochat

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BENIGN = "PLACEHOLDERQZX"


def nanoplan(*argv: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `nanoplan ARGV` in-process; nothing is ever launched."""
    out, err = io.StringIO(), io.StringIO()
    code: int | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd or Path.cwd()), \
            mock.patch("runner.launcher.run_torchrun", side_effect=AssertionError("launched")), \
            mock.patch.object(sys, "argv", ["nanoplan", *argv]):
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return int(code or 0), out.getvalue(), err.getvalue()


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
def test_skypilot_export_yields_only_the_expected_keys_and_values(gpu_plan_doc: dict, value: str) -> None:
    bucket = "s3://bucket/" + value
    bad_text = skypilot_task(_hostile_plan(gpu_plan_doc, value), "plan.json", bucket=bucket)
    good_text = skypilot_task(_hostile_plan(gpu_plan_doc, BENIGN), "plan.json", bucket="s3://bucket/" + BENIGN)
    bad, good = yaml.safe_load(bad_text), yaml.safe_load(good_text)
    assert list(bad) == ["name", "workdir", "num_nodes", "resources", "envs", "file_mounts", "setup", "run"]
    assert bad["file_mounts"] == {SKYPILOT_MOUNT: {"source": bucket, "mode": "MOUNT"}}
    for key in ("workdir", "num_nodes", "resources", "envs", "setup"):
        assert bad[key] == good[key]
    assert bad["name"].startswith("nanoplan-") and shlex.quote(bad["name"]) == bad["name"]
    rd_bad, rd_good = _under(SKYPILOT_MOUNT, value), _under(SKYPILOT_MOUNT, BENIGN)
    assert _words(bad["run"]) == [w.replace(rd_good, rd_bad) for w in _words(good["run"])]
    head = [line for line in bad_text.splitlines() if line and not line[0].isspace()]
    comments = [line for line in head if line.startswith("#")]
    assert len(comments) == len([g for g in good_text.splitlines() if g.startswith("#")])
    assert [line.split(":")[0] for line in head if not line.startswith("#")] == list(bad)   # no other top-level line
