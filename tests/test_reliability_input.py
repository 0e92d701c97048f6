"""Bad input never gets past the front door: exit code 2, one line naming the field, no traceback.

`nanoplan validate`, `nanoplan estimate --profile` and `nanoplan run` are fed plan.json files and
profile YAMLs that hypothesis derives from good ones: wrong types, missing and unknown fields,
negative/zero/NaN/inf and huge numbers, a wrong schema_version, non-UTF-8 bytes and YAML tags that
try to construct Python objects. They run in-process through nanoplan.main (the console entry
point), with `run`'s launcher replaced by a tripwire so that nothing is ever launched.

Which numbers are bad is decided here, not read from the schema: NaN, infinities and negatives
are bad everywhere; 1e300 and 10**30 are bad for every input (request and profile) number; zero
is bad for every input number except those where it means "off" or "free" (ZERO_OK).
Also: run dirs named by a plan file must stay under the current directory, and links inside a
run dir must not lead out of it.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from nanoplan import cli
from planner.plan import Plan
from planner.profiles import HardwareProfile
from tests.conftest import REPO, make_tiny_plan, runner_env
from tests.errlines import as_one_line

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PROFILE_YAML = REPO / "hardware_profiles" / "H100-SXM.yaml"

# Input numbers for which zero is meaningful (off, free, no headroom, seed 0, ...).
ZERO_OK = {
    "request.price", "request.loss_chunk_tokens", "request.headroom",
    "request.hyper.weight_decay", "request.hyper.grad_clip", "request.hyper.warmup_steps",
    "request.hyper.warmdown_frac", "request.hyper.seed", "request.hyper.val_every_steps",
    "request.hyper.val_tokens", "request.hyper.patience_evals", "request.hyper.betas.0", "request.hyper.betas.1",
    "usd_per_gpu_hour", "overheads.cuda_context_bytes", "overheads.nccl_bytes", "overheads.fragmentation",
}   # matched against the end of the dotted path, so they hold in a profile YAML and inside a plan


# ---------------------------------------------------------------- running the CLI in-process

class Tripwire(Exception):
    """Raised if `nanoplan run` gets as far as launching torchrun."""


def nanoplan(*argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `nanoplan ARGV` through the console entry point."""
    out, err = io.StringIO(), io.StringIO()
    code: int | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch("runner.launcher.run_torchrun", side_effect=Tripwire), mock.patch.object(sys, "argv", ["nanoplan", *argv]):
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return int(code or 0), out.getvalue(), err.getvalue()


def one_error_line(code: int, err: str) -> str:
    """The error, with its hint line appended in parentheses: 'error: FIELD: PROBLEM (HINT)'."""
    assert code == 2, err
    return as_one_line(err)


# ---------------------------------------------------------------- walking a document with its schema

Path_ = tuple[Any, ...]


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def get(doc: Any, path: Path_) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def put(doc: Any, path: Path_, value: Any) -> None:
    get(doc, path[:-1])[path[-1]] = value


def _models_in(ann: Any) -> list[type[BaseModel]]:
    args = typing.get_args(ann)
    return [t for t in (args or (ann,)) if isinstance(t, type) and issubclass(t, BaseModel)]


def model_nodes(cls: type[BaseModel], doc: dict, path: Path_ = ()) -> list[tuple[Path_, type[BaseModel]]]:
    """Every object in `doc` that is a pydantic model (not a free dict like memory.breakdown)."""
    out = [(path, cls)]
    for name, f in cls.model_fields.items():
        sub = doc.get(name)
        for m in _models_in(f.annotation):
            if isinstance(sub, dict):
                out += model_nodes(m, sub, (*path, name))
        if typing.get_origin(f.annotation) is list and isinstance(sub, list):
            for m in _models_in(typing.get_args(f.annotation)[0]):
                for i, item in enumerate(sub):
                    out += model_nodes(m, item, (*path, name, i))
    return out


def required_fields(cls: type[BaseModel], doc: dict) -> list[Path_]:
    return [(*p, name) for p, m in model_nodes(cls, doc) for name, f in m.model_fields.items()
            if f.is_required() and name in get(doc, p)]


def leaves(doc: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in leaves(v, (*path, k))]
    if isinstance(doc, list) and doc and all(isinstance(v, dict) for v in doc):
        return [x for i, v in enumerate(doc) for x in leaves(v, (*path, i))]
    return [(path, doc)]


def numbers(doc: Any) -> list[Path_]:
    """Paths of every number, including the items of number lists (betas)."""
    out = []
    for path, v in leaves(doc):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(path)
        elif isinstance(v, list):
            out += [(*path, i) for i, x in enumerate(v) if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return out


def wrong_type(value: Any) -> st.SearchStrategy:
    """Values of a type pydantic will not coerce into `value`'s type (lax mode)."""
    if isinstance(value, dict):
        return st.sampled_from([[1, 2], "text", 3])
    if isinstance(value, list):
        return st.sampled_from([{"a": 1}, "text", 7])
    if isinstance(value, bool):
        return st.sampled_from(["maybe", [True], {"b": 1}, 0.5])
    if isinstance(value, (int, float)):
        return st.sampled_from(["fast", [1], {"n": 1}, True if isinstance(value, float) else "1e3x"])
    if value is None:           # an optional field, unset: any number may be valid for it
        return st.sampled_from([[value], {"s": value}])
    return st.sampled_from([[value], {"s": value}, 12])


BAD_EVERYWHERE = [math.nan, math.inf, -math.inf, -1, -1e-3]
HUGE = [1e300, 10**30]


def bad_numbers(path: Path_, value: Any, is_input: bool) -> list[Any]:
    vals = list(BAD_EVERYWHERE)
    if is_input:
        vals += HUGE
        if not any(dotted(path) == z or dotted(path).endswith("." + z) for z in ZERO_OK):
            vals.append(0)
    return vals


# ---------------------------------------------------------------- mutations of a document

@st.composite
def mutation(draw: st.DrawFn, doc: dict, cls: type[BaseModel], input_prefix: Path_ = ()) -> tuple[str, dict, str]:
    """(kind, mutated copy, dotted name the error must mention)."""
    d = json.loads(json.dumps(doc))
    kind = draw(st.sampled_from(["type", "missing", "unknown", "number"]))
    if kind == "type":
        path, value = draw(st.sampled_from(leaves(d)))
        put(d, path, draw(wrong_type(value)))
        return kind, d, dotted(path)
    if kind == "missing":
        path = draw(st.sampled_from(required_fields(cls, d)))
        del get(d, path[:-1])[path[-1]]
        return kind, d, dotted(path)
    if kind == "unknown":
        node, _ = draw(st.sampled_from(model_nodes(cls, d)))
        key = draw(st.sampled_from(["bogus", "extra_field", "lr_typo", "gpus"]))
        if key in get(d, node):
            key += "_x"
        get(d, node)[key] = draw(st.sampled_from([1, "x", None, {"a": 1}]))
        return kind, d, dotted((*node, key))
    path = draw(st.sampled_from(numbers(d)))
    is_input = path[: len(input_prefix)] == input_prefix
    put(d, path, draw(st.sampled_from(bad_numbers(path, get(d, path), is_input))))
    return kind, d, dotted(path)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("input")


@pytest.fixture(scope="module")
def good_plan(work: Path, tiny_data: Path) -> dict:
    path = make_tiny_plan(work / "plan.json", tiny_data)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def good_profile() -> dict:
    return yaml.safe_load(PROFILE_YAML.read_text())


def write_plan(work: Path, doc: dict) -> str:
    p = work / "plan.json"       # the same name as the good plan, so launch.command stays current
    p.write_text(json.dumps(doc))
    return str(p)


def write_profile(work: Path, doc: dict) -> str:
    p = work / "profile.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


ESTIMATE = ["estimate", "--gpu", "8xH100", "--preset", "tiny", "--hours", "1", "--profile"]


def test_the_unmutated_inputs_are_accepted(work: Path, good_plan: dict, good_profile: dict) -> None:
    """Otherwise every refusal below would be vacuous."""
    plan = write_plan(work, good_plan)
    code, out, err = nanoplan("validate", plan)
    assert code == 0 and err == "", err
    code, out, err = nanoplan("run", plan, "--dry-run")
    assert code == 0 and err == "" and "-m runner.train --plan" in out, err
    code, out, err = nanoplan(*ESTIMATE, write_profile(work, good_profile))
    assert code == 0 and err == "", err
    with pytest.raises(Tripwire):   # the tripwire is live: a good plan gets as far as launching
        with mock.patch("runner.launcher.run_torchrun", side_effect=Tripwire):
            cli.app(["run", plan, "--run-dir", str(work / "launched")], standalone_mode=False)   # locked there


# ---------------------------------------------------------------- plan.json: validate and run

@SETTINGS
@given(data=st.data())
def test_validate_refuses_bad_plans(work: Path, good_plan: dict, data: st.DataObject) -> None:
    kind, doc, field = data.draw(mutation(good_plan, Plan, ("request",)))
    line = one_error_line(*nanoplan("validate", write_plan(work, doc))[::2])
    assert field in line, (kind, line)


@SETTINGS
@given(data=st.data())
def test_run_refuses_bad_plans(work: Path, good_plan: dict, data: st.DataObject) -> None:
    kind, doc, field = data.draw(mutation(good_plan, Plan, ("request",)))
    line = one_error_line(*nanoplan("run", write_plan(work, doc), "--run-dir", str(work / "run"))[::2])
    assert field in line, (kind, line)
    assert not (work / "run").exists()


@pytest.mark.parametrize("version", [2, 0, "1", None, 1.5, [1]])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_wrong_schema_version(work: Path, good_plan: dict, version: Any, command: str) -> None:
    doc = {**good_plan, "schema_version": version}
    line = one_error_line(*nanoplan(command, write_plan(work, doc))[::2])
    assert "field 'schema_version'" in line and "regenerate" in line


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b)), where=st.floats(0, 1))
def test_non_utf8_plan(work: Path, good_plan: dict, junk: bytes, where: float) -> None:
    text = json.dumps(good_plan).encode()
    cut = int(where * len(text))
    p = work / "plan.json"
    p.write_bytes(text[:cut] + junk + text[cut:])
    for command in ("validate", "run"):
        line = one_error_line(*nanoplan(command, str(p))[::2])
        assert line == f"error: {p}: is not UTF-8 text (regenerate it with nanoplan estimate --out)"


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("content,words", [
    (b"[" * 100_000, "is not a plan"),                                  # deeper than Python's stack
    (b'{"schema_version": ' + b"1" * 5000 + b"}", "is not a plan"),      # past int's 4300-digit limit
    (b"", "is not valid JSON"),
    (b"NaN", "must hold a JSON object"),
    (b'["schema_version", 1]', "must hold a JSON object"),
], ids=["deep", "5000-digits", "empty", "NaN", "list"])
def test_malformed_json(work: Path, content: bytes, words: str) -> None:
    p = work / "raw.json"
    p.write_bytes(content)
    for command in ("validate", "run"):
        line = one_error_line(*nanoplan(command, str(p))[::2])
        assert line.startswith(f"error: {p}: {words}"), line


# ---------------------------------------------------------------- profile YAML: estimate --profile

@SETTINGS
@given(data=st.data())
def test_estimate_refuses_bad_profiles(work: Path, good_profile: dict, data: st.DataObject) -> None:
    kind, doc, field = data.draw(mutation(good_profile, HardwareProfile, ()))
    path = write_profile(work, doc)
    line = one_error_line(*nanoplan(*ESTIMATE, path)[::2])
    assert path in line and f"'{field}'" in line, (kind, line)


TAGS = [
    '!!python/object/apply:os.system ["touch {marker}"]',
    '!!python/object/new:subprocess.Popen [["touch", "{marker}"]]',
    "!!python/name:os.system",
    '!!python/object:pathlib.PosixPath {{}}',
    "!!python/module:os",
    '!!python/tuple [1, 2]',
]


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tag=st.sampled_from(TAGS), data=st.data())
def test_yaml_tags_construct_nothing(work: Path, good_profile: dict, tag: str, data: st.DataObject) -> None:
    marker = work / "pwned"
    path, _ = data.draw(st.sampled_from([p for p in leaves(good_profile) if p[0] not in ("name", "default_provider")]))
    doc = json.loads(json.dumps(good_profile))
    put(doc, path, "__TAG__")
    text = yaml.safe_dump(doc, sort_keys=False).replace("__TAG__", tag.format(marker=marker))
    (work / "profile.yaml").write_text(text)
    code, out, err = nanoplan(*ESTIMATE, str(work / "profile.yaml"))
    assert not marker.exists()
    line = one_error_line(code, err)
    assert "not valid YAML at line " in line and "could not determine a constructor for the tag" in line, line


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b)))
def test_non_utf8_profile(work: Path, junk: bytes) -> None:
    p = work / "profile.yaml"
    p.write_bytes(PROFILE_YAML.read_bytes()[:200] + junk + PROFILE_YAML.read_bytes()[200:])
    line = one_error_line(*nanoplan(*ESTIMATE, str(p))[::2])
    assert line == f"error: {p}: is not UTF-8 text (save the profile as UTF-8 YAML)"


@pytest.mark.parametrize("text,words", [
    ("a: &a [1, 2]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
     "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\nname: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n", "field 'name'"),
    ("[" * 50_000, "not valid YAML"),
    ("- just\n- a list\n", "a profile must be a YAML mapping"),
    ("name: H100\n  bad indent: 1\n", "not valid YAML at line 2"),
], ids=["billion-laughs", "deep", "list", "indent"])
def test_hostile_yaml_shapes(work: Path, text: str, words: str) -> None:
    p = work / "profile.yaml"
    p.write_text(text)
    line = one_error_line(*nanoplan(*ESTIMATE, str(p))[::2])
    assert words in line, line


# ---------------------------------------------------------------- paths: where the runner may write

@pytest.mark.parametrize("run_dir", ["../escape", "runs/../../escape", "/tmp/elsewhere", "~/runs", ""])
def test_plan_run_dir_must_stay_under_the_current_directory(work: Path, run_dir: str) -> None:
    plan = make_tiny_plan(work / "p.json", None, run_dir=run_dir)
    line = one_error_line(*nanoplan("run", str(plan), "--dry-run")[::2])
    assert line == (f"error: {plan}: field 'launch.run_dir': is {run_dir!r}; a plan file may only name a run dir "
                    "inside the current directory (relative, without '..') "
                    f"(pass --run-dir {run_dir} to use it anyway)")
    code, out, err = nanoplan("run", str(plan), "--dry-run", "--run-dir", str(work / "chosen"))
    assert code == 0 and out.strip().endswith(f"--run-dir {work / 'chosen'}"), err   # the user's own choice


def test_plan_run_dir_inside_is_fine(work: Path) -> None:
    plan = make_tiny_plan(work / "p.json", None, run_dir="runs/./tiny")
    code, out, err = nanoplan("run", str(plan), "--dry-run")
    assert code == 0 and err == "", err


@pytest.mark.parametrize("link", ["checkpoints", "metrics.jsonl", "tensorboard", "checkpoints/step_00000005"])
def test_links_out_of_the_run_dir_are_refused(tmp_path: Path, tiny_plan, link: str) -> None:
    plan = tiny_plan(steps=5, gpus=1)
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (outside / "step_00000001").mkdir()          # what retention would delete through the link
    (run / link).parent.mkdir(parents=True, exist_ok=True)
    (run / link).symlink_to(outside)
    line = one_error_line(*nanoplan("run", str(plan), "--run-dir", str(run))[::2])
    assert line.startswith(f"error: preflight: {run / link} is a link to {outside}, outside the run dir {run}")
    # the runner itself refuses too (it is also started by hand, or with --force)
    r = subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(plan), "--run-dir", str(run)],
                       capture_output=True, text=True, timeout=60, cwd=REPO, env=runner_env())
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"error: --run-dir: {run / link} is a link to {outside}, outside the run dir {run}; "
                                "the runner only writes inside its run dir "
                                "(remove the link, or pass the real directory as --run-dir)")
    assert sorted(p.name for p in outside.iterdir()) == ["step_00000001"]


def test_a_linked_run_dir_itself_is_fine(tmp_path: Path, tiny_plan) -> None:
    real = tmp_path / "scratch" / "run"
    real.mkdir(parents=True)
    (tmp_path / "run").symlink_to(real)
    from planner.plan import load_plan
    from runner.preflight import run_preflight

    pf = run_preflight(load_plan(tiny_plan()), "p.json", tmp_path / "run", None, False)
    assert pf.ok, pf.problems


# ---------------------------------------------------------------- run dirs that cannot hold a run

@pytest.mark.parametrize("where,words", [
    ("afile/run", "run dir {tmp}/afile/run cannot be created: {tmp}/afile is not a directory"),
    ("afile", "run dir {tmp}/afile is not a directory"),
    ("/proc/nanoplan-run", "run dir /proc/nanoplan-run cannot be created (/proc is not writable: "),
])
def test_preflight_refuses_a_run_dir_it_cannot_write(tmp_path: Path, tiny_plan, where: str, words: str) -> None:
    """Places that refuse writes even to root (a path through a regular file, /proc): the probe is
    a real write, not a permission-bit check."""
    if where.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux /proc")
    plan = tiny_plan()
    (tmp_path / "afile").write_text("not a directory\n")
    run = where if where.startswith("/") else str(tmp_path / where)
    line = one_error_line(*nanoplan("run", str(plan), "--run-dir", run)[::2])
    assert line.startswith("error: preflight: " + words.format(tmp=tmp_path)), line
    assert line.endswith("pick another --run-dir (fix it, or pass --force to launch anyway)"), line
    assert (tmp_path / "afile").read_text() == "not a directory\n"


def test_preflight_refuses_a_disk_without_room(tmp_path: Path, tiny_plan) -> None:
    """The CLI end of the free-space check (test_runner_cli checks the arithmetic): one line, nothing launched."""
    import shutil

    plan = tiny_plan()
    need = json.loads(plan.read_text())["schedule"]["storage_bytes"]
    full = shutil._ntuple_diskusage(total=10 * need, used=10 * need - need // 2, free=need // 2)
    with mock.patch("runner.preflight.shutil.disk_usage", return_value=full):
        line = one_error_line(*nanoplan("run", str(plan), "--run-dir", str(tmp_path / "run"))[::2])
    assert line.startswith(f"error: preflight: free disk at {tmp_path} is "), line
    assert "the plan's checkpoints need" in line and "lower --keep-last or pick another --run-dir" in line
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- checkpoints that are not ours

class Payload:
    """Unpickling this runs a shell command: what a hostile "checkpoint" would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os
        import shlex

        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def reseal(ckdir: Path) -> None:
    """Recompute meta.json's checksums, as a forger would, so that only torch.load can refuse."""
    from runner.checkpoint_meta import verify
    from runner.torch_files import sha256_file

    meta = json.loads((ckdir / "meta.json").read_text())
    for name in meta["files"]:
        meta["files"][name] = {"sha256": sha256_file(ckdir / name), "bytes": (ckdir / name).stat().st_size}
    from runner.runfiles import seal

    (ckdir / "meta.json").write_text(json.dumps(seal(meta)))    # meta.json's own checksum too
    assert verify(ckdir) == (True, "ok")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, Path]:
    """(plan, run dir) of a 2-step one-process run with its checkpoint at step 2."""
    d = tmp_path_factory.mktemp("finished")
    plan = make_tiny_plan(d / "plan.json", tiny_data, steps=2, gpus=1)
    r = subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(plan), "--run-dir", str(d / "run")],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return plan, d / "run"


def _random_bytes(path: Path, marker: Path) -> None:
    path.write_bytes(bytes(range(256)) * 37)


def _json_file(path: Path, marker: Path) -> None:
    path.write_text(json.dumps({"state": {"w": [1.0, 2.0]}, "note": "a JSON file renamed .pt"}))


def _pickle_payload(path: Path, marker: Path) -> None:
    import pickle

    import torch

    torch.save({"w": torch.ones(2), "hook": Payload(marker)}, path)
    with pytest.raises(pickle.UnpicklingError):       # torch's own default refuses it ...
        torch.load(path)
    torch.load(path, weights_only=False)              # ... and it is live: a plain unpickle runs it
    assert marker.exists()
    marker.unlink()


@pytest.mark.parametrize("name,forge,says", [
    ("model.pt", _random_bytes, "it is not a torch checkpoint"),
    ("optim_rank0.pt", _json_file, "it is not a torch checkpoint"),
    ("model.pt", _pickle_payload, "it holds pickled objects, not just tensors (Trying to load unsupported GLOBAL"),
])
def test_a_checkpoint_file_that_is_not_ours_is_refused(tmp_path: Path, finished_run, name: str, forge, says: str) -> None:
    """`nanoplan run --resume` on a checkpoint whose file was replaced and whose checksums were
    recomputed: exit 2, one line naming the file, and nothing in the file is executed."""
    import shutil

    from runner.checkpoint_layout import step_dir
    from runner.checkpoint_meta import verify

    plan, base = finished_run
    run, marker = tmp_path / "run", tmp_path / "PAYLOAD-RAN"
    shutil.copytree(base, run)
    ckdir = step_dir(run, 2)
    forge(ckdir / name, marker)
    reseal(ckdir)
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run), "--resume"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"error: {ckdir / name}: refused by torch.load(weights_only=True): {says}"), errors[0]
    assert errors[0].endswith("(it is not a nanoplan checkpoint; move it out of the run dir, or use another --run-dir)")
    assert not marker.exists()
    assert verify(ckdir) == (True, "ok")           # refused, not mistaken for damage and set aside


def test_a_dcp_metadata_pickle_payload_is_refused(tmp_path: Path) -> None:
    """zero2/fsdp checkpoints: DCP unpickles .metadata without weights_only, so runner.dcp checks it first."""
    import pickle
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from planner.errors import PlanError
    from runner.dcp import check_metadata

    good, bad, marker = tmp_path / "good", tmp_path / "bad", tmp_path / "PAYLOAD-RAN"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                # "assuming the intent is to save in a single process"
        dcp.save({"w": torch.ones(3), "step": 3}, checkpoint_id=good)
    check_metadata(good)                               # DCP's own metadata passes
    bad.mkdir()
    (bad / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(PlanError) as e:
        check_metadata(bad)
    assert str(e.value).startswith(f"{bad / '.metadata'}: refused: it is not DCP checkpoint metadata "
                                   "(global posix.system is not DCP metadata)")
    assert not marker.exists()
    pickle.loads((bad / ".metadata").read_bytes())     # the payload is live
    assert marker.exists()
