"""Bad input never gets past the front door: exit code 2, one line naming the field, no traceback.

`nanoplan validate`, `nanoplan estimate --profile` and `nanoplan run` are fed plan.json files and
profile YAMLs that hypothesis derives from good ones: wrong types, missing and unknown fields,
negative/zero/NaN/inf and huge numbers, a wrong schema_version, non-UTF-8 bytes and YAML tags that
try to construct Python objects. They run in-process through planner.cli.main (the console entry
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

import planner.cli as cli
from planner.plan import Plan
from planner.profiles import HardwareProfile
from tests.conftest import REPO, make_tiny_plan, runner_env

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
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


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
            cli.app(["run", plan, "--run-dir", str(work / "run")], standalone_mode=False)


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
