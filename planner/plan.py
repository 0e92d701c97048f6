"""plan.json: the versioned pydantic schema (inputs + every derived number).

A plan holds the `request` it was built from (including the full hardware profile), and
the numbers derived from it. `planner.build.rederive` rebuilds a plan from its request, so
a hand-edited or stale plan is caught (`nanoplan validate`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from planner.errors import DuplicateKeyError, PlanError, echo, find_control, pydantic_one_line, strict_json_loads
from planner.fit_verdict import DEFAULT_HEADROOM, Verdict
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS
from planner.memory_terms import AcPolicy, Optimizer, Precision, Strategy
from planner.profiles import HardwareProfile
from planner.spec import ModelSpec

SCHEMA_VERSION = 1
Finite = dict(allow_inf_nan=False, strict=True)   # strict: a JSON true is not the number 1
# Upper bounds far beyond any real run: they turn absurd input into a one-line error instead of
# an overflow deep inside torch or numpy (e.g. a 10**30 seed).
MAX_COUNT = 10**15
Beta = Annotated[float, Field(ge=0, lt=1, **Finite)]
NonNegInt = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    """extra="forbid", and no control characters in any string (paths, names, list items, keys), nor the
    invisible bidi and zero-width ones (planner.errors.INVISIBLE) that make a reviewer read something else.

    A newline in run_dir or data_dir would otherwise become a line of its own in an exported
    sbatch script or SkyPilot YAML (planner/export.py). The check walks nested models too, so the
    hardware profile and model spec inside request are covered.
    """

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _printable(cls, v: object, info: ValidationInfo) -> object:
        ann = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(ann, type) and issubclass(ann, _Strict):
            return v            # a nested _Strict model checks its own fields (so the error names the leaf)
        found = find_control(v)
        if found:
            where, i, code = found
            inner = f"'{where}' " if where else ""
            raise ValueError(f"{inner}holds a control character ({code} at index {i}); "
                             "paths and names must be printable (no newline, CR, NUL, tab, escape, "
                             "nor invisible bidi or zero-width characters)")
        return v


class Hyper(_Strict):
    """Optimisation hyper-parameters the runner uses (defaults follow nanoGPT/nanochat)."""

    lr: float = Field(default=3e-4, gt=0, le=10, **Finite)          # AdamW peak LR
    matrix_lr: float = Field(default=0.02, gt=0, le=10, **Finite)   # Muon LR (nanochat uses 0.02)
    weight_decay: float = Field(default=0.0, ge=0, le=10, **Finite)
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    grad_clip: float = Field(default=1.0, ge=0, le=1e6, **Finite)
    warmup_steps: int = Field(default=0, ge=0, le=MAX_COUNT)
    warmdown_frac: float = Field(default=0.2, ge=0, le=1, **Finite)  # nanochat: last 20% decays
    decay: Literal["linear", "cosine"] = "linear"
    seed: int = Field(default=1337, ge=0, le=2**63 - 1)   # torch.manual_seed takes 64 bits
    val_every_steps: int = Field(default=250, ge=0, le=MAX_COUNT)
    val_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)  # 0 = one device batch per rank
    patience_evals: int = Field(default=0, ge=0, le=MAX_COUNT)  # early stop after N evals without improvement; 0 = off


class SpotRequest(_Strict):
    """Plan on spot (interruptible) GPUs: the provider's spot price, its interruptions, the cadence they call for.

    None fields take the profile's figures (mtbi) or the optimum (checkpoint cadence); planner/spot.py."""

    mtbi_hours: float | None = Field(default=None, gt=0, le=1e6, **Finite)   # --mtbi: mean time between interruptions
    checkpoint_every_minutes: float | None = Field(default=None, gt=0, le=1e6, **Finite)   # None: Young/Daly
    quantile: float = Field(default=0.9, gt=0, lt=1, **Finite)   # the run's steps finish within the cap this often
    trials: int = Field(default=1000, ge=50, le=100_000)         # Monte-Carlo runs of the interruptions
    seed: int = Field(default=0, ge=0, le=2**63 - 1)


TrainerName = Literal["nanoplan", "nanochat", "torchtitan", "deepspeed"]
AcMode = Literal["none", "selective-op", "full"]


class TrainerRef(_Strict):
    """Whose training step the plan models (planner/trainers/): nanoplan's runner by default, or the
    named version of another trainer. `ac_mode` is torchtitan's activation-checkpoint mode; `window_pattern`
    nanochat's sliding-window pattern (`--window-pattern`; None: its default, SSSL)."""

    name: TrainerName = "nanoplan"
    version: str | None = Field(default=None, min_length=1, max_length=40)
    ac_mode: AcMode | None = None
    window_pattern: Literal["SSSL", "L"] | None = None


DEFAULT_TRAINER = TrainerRef()


class PlanRequest(_Strict):
    """Everything the user chose. The rest of the plan is derived from this."""

    gpu: str
    profile: HardwareProfile
    provider: str | None = None
    price: float | None = Field(default=None, ge=0, le=1e4, **Finite)
    model: ModelSpec
    device_batch_size: int | None = Field(default=None, gt=0, le=1_000_000)
    total_batch_tokens: int = Field(default=524_288, gt=0, le=10**12)
    precision: Precision = "bf16-autocast"
    optimizer: Optimizer = "adamw"
    strategy: Strategy = "ddp"
    activation_checkpointing: bool = False
    # with checkpointing: every k-th block (1: all), and what a checkpointed block keeps (planner/checkpointing.py)
    ac_every: int = Field(default=1, ge=1, le=100_000)
    ac_policy: AcPolicy = "full"
    fp8: bool = False           # FP8 matmuls in the blocks' linears (torchao Float8Linear): planned, not run
    loss_chunk_tokens: int = Field(default=DEFAULT_LOSS_CHUNK_TOKENS, ge=0, le=MAX_COUNT)
    compile: bool = True
    budget_usd: float | None = Field(default=None, gt=0, le=1e12, **Finite)
    hours: float | None = Field(default=None, gt=0, le=1e6, **Finite)
    steps: int | None = Field(default=None, gt=0, le=10**12)
    # seconds a launch pays before its first step (start-up, compile), as measured; None: planner/startup.py's
    # assumptions. Absent in plans written before it (_LATER_FIELDS).
    startup_seconds: float | None = Field(default=None, ge=0, le=86_400, **Finite)
    dataset_tokens: int | None = Field(default=None, gt=0, le=MAX_COUNT)
    max_epochs: float | None = Field(default=None, gt=0, le=1e6, **Finite)  # stop early at this many epochs
    data_dir: str | None = None
    checkpoint_every_minutes: float = Field(default=60.0, gt=0, le=1e6, **Finite)
    keep_last: int = Field(default=3, ge=1, le=1000)
    headroom: float = Field(default=DEFAULT_HEADROOM, ge=0, lt=1, **Finite)   # planner.fit_verdict
    mfu: float | None = Field(default=None, gt=0, le=1, **Finite)
    run_dir: str = "runs/latest"
    hyper: Hyper = Hyper()
    trainer: TrainerRef = DEFAULT_TRAINER   # absent in plans written before trainers (nanoplan's runner)
    spot: SpotRequest | None = None
    # tensor parallelism (planner/parallelism.py): its degree, and the sequence-parallel variant; absent in plans
    # written before them (1, on), and left out of the plan's hash at those values (_LATER_DEFAULTS)
    tp: int = Field(default=1, ge=1, le=1024)
    sequence_parallel: bool = True

    @model_validator(mode="after")
    def _one_length(self) -> PlanRequest:
        given = [n for n in ("budget_usd", "hours", "steps") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("exactly one of budget_usd (--budget), hours (--hours) or steps (--steps) "
                             f"must set the run's length; got {', '.join(given) or 'none'}")
        return self


class HardwarePlan(_Strict):
    spec: str
    profile_name: str
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    num_gpus: int = Field(gt=0)
    provider: str
    usd_per_gpu_hour: float = Field(ge=0, **Finite)
    price_date: str
    price_source: str


class ModelPlan(_Strict):
    name: str
    n_params: int = Field(gt=0)
    params_by_group: dict[str, NonNegInt]
    matmul_params: int = Field(gt=0)
    flops_per_token: int = Field(gt=0)


class TrainingPlan(_Strict):
    device_batch_size: int = Field(gt=0)
    grad_accum_steps: int = Field(gt=0)
    total_batch_tokens: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    precision: Precision
    optimizer: Optimizer
    strategy: Strategy
    activation_checkpointing: bool
    loss_chunk_tokens: int = Field(ge=0)
    compile: bool
    # the residual stream between blocks (runner/model.py; bf16 under bf16 precisions, docs/numerics.md).
    # None: a plan written before it was recorded.
    residual_dtype: Literal["bf16", "fp32"] | None = None
    ac_every: int = Field(default=1, ge=1, le=100_000)   # absent in plans written before issue 25: every block
    ac_policy: AcPolicy = "full"
    fp8: bool = False
    # absent in plans written before issue 29: no tensor parallelism, no HSDP (planner/parallelism.py)
    tp: int = Field(default=1, ge=1, le=1024)
    sequence_parallel: bool = True
    data_parallel: int | None = Field(default=None, ge=1)   # with tp or hsdp: data-parallel ranks (GPUs / tp)
    hsdp_shard: int | None = Field(default=None, ge=1)      # hsdp: the GPUs of a shard group (one node's / tp)


class MemoryPlan(_Strict):
    per_gpu_bytes: int = Field(ge=0)
    capacity_bytes: int = Field(gt=0)
    usable_bytes: int = Field(gt=0)
    headroom: float = Field(ge=0, lt=1, **Finite)
    fits: bool                      # not refused: the verdict is "fits" or "tight" (false only for "does not fit")
    peak_phase: str
    breakdown: dict[str, NonNegInt]
    overhead: dict[str, NonNegInt]
    phases: dict[str, NonNegInt]
    # fits / tight (may run out of memory through fragmentation) / does not fit (planner.fit_verdict);
    # None: a plan written before the verdict was recorded
    verdict: Verdict | None = None


class ThroughputPlan(_Strict):
    mfu: float = Field(gt=0, le=1, **Finite)
    effective_mfu: float = Field(ge=0, le=1, **Finite)
    peak_flops_per_gpu: float = Field(gt=0, **Finite)
    tokens_per_sec: float = Field(gt=0, **Finite)
    step_seconds: float = Field(gt=0, **Finite)
    compute_seconds: float = Field(ge=0, **Finite)
    comm_seconds: float = Field(ge=0, **Finite)
    exposed_comm_seconds: float = Field(ge=0, **Finite)
    optimizer_seconds: float = Field(default=0.0, ge=0, **Finite)    # optimizer step + clipping
    micro_step_seconds: float = Field(default=0.0, ge=0, **Finite)   # accumulation, launches, FSDP copies


class BudgetPlan(_Strict):
    usd: float = Field(ge=0, **Finite)
    hours: float = Field(gt=0, **Finite)
    usd_per_hour: float = Field(ge=0, **Finite)
    limited_by: Literal["budget", "hours", "steps", "epochs"]
    # paid before the steps train: start-up, rendezvous, compile warm-up (planner/startup.py); in `hours`
    startup_seconds: float = Field(default=0.0, ge=0, **Finite)


class SchedulePlan(_Strict):
    total_steps: int = Field(gt=0)
    tokens_per_step: int = Field(gt=0)
    total_tokens: int = Field(gt=0)
    tokens_per_param: float = Field(ge=0, **Finite)
    dataset_tokens: int | None = Field(default=None, gt=0)
    epochs: float | None = Field(default=None, ge=0, **Finite)
    checkpoint_every_minutes: float = Field(gt=0, **Finite)
    checkpoint_every_steps: int = Field(gt=0)
    num_checkpoints: int = Field(ge=1)
    model_file_bytes: int = Field(ge=0)
    optimizer_bytes_per_rank: int = Field(ge=0)
    checkpoint_bytes: int = Field(ge=0)
    keep_last: int = Field(ge=1)
    storage_bytes: int = Field(ge=0)


class SpotPlan(_Strict):
    """A spot plan's price, interruptions, checkpoint cadence and expected cost (planner/spot.py; docs/spot.md).

    Seconds are paid (billed) seconds. The run's steps (schedule.total_steps) finish within the budget's cap in
    `finish_probability` of the Monte-Carlo's runs; the others stop at the cap with the LR schedule re-laid
    (runner/schedule.py). Costs are for those steps; `on_demand_*` for the same steps at the provider's
    on-demand price."""

    provider: str
    usd_per_gpu_hour: float = Field(ge=0, **Finite)
    price_date: str
    price_source: str
    on_demand_usd_per_gpu_hour: float | None = Field(default=None, ge=0, **Finite)
    mtbi_hours: float = Field(gt=0, **Finite)
    mtbi_source: str
    storage_bytes_per_s: float = Field(gt=0, **Finite)
    storage_source: str
    write_seconds: float = Field(ge=0, **Finite)          # C: one checkpoint written
    restart_seconds: float = Field(ge=0, **Finite)        # R: what a relaunch costs, the parts in restart_parts
    restart_parts: dict[str, Annotated[float, Field(ge=0, **Finite)]]
    optimum_minutes: float = Field(gt=0, **Finite)        # Young/Daly: sqrt(2 C M)
    checkpoint_every_minutes: float = Field(gt=0, **Finite)
    cadence: Literal["young-daly", "request"]
    expected_interruptions: float = Field(ge=0, **Finite)
    expected_lost_minutes: float = Field(ge=0, **Finite)  # work lost per interruption (the restart not included)
    expected_hours: float = Field(ge=0, **Finite)
    p90_hours: float = Field(ge=0, **Finite)
    expected_usd: float = Field(ge=0, **Finite)
    p90_usd: float = Field(ge=0, **Finite)
    finish_probability: float = Field(ge=0, le=1, **Finite)
    cap_hours: float | None = Field(default=None, gt=0, **Finite)   # the budget or --hours, in paid hours
    on_demand_hours: float = Field(ge=0, **Finite)
    on_demand_usd: float | None = Field(default=None, ge=0, **Finite)
    quantile: float = Field(gt=0, lt=1, **Finite)
    trials: int = Field(gt=0)
    seed: int = Field(ge=0)


Bound = Annotated[float, Field(ge=0, **Finite)]


class UncertaintyPlan(_Strict):
    """P10–P90 of the speed-driven figures, from the step-time model's held-out errors on the public runs most like
    this plan (planner/uncertainty.py). A figure the length rule fixes (hours and dollars under a budget, tokens
    under --steps) has no band; none at all where too few comparable runs exist (`basis` says why)."""

    basis: str                                   # "14 public runs on H100/H200, compiled, 1 node", or why none
    runs: int = Field(ge=0)
    tokens_per_sec: tuple[Bound, Bound] | None = None
    hours: tuple[Bound, Bound] | None = None
    tokens: tuple[NonNegInt, NonNegInt] | None = None
    usd: tuple[Bound, Bound] | None = None
    # how likely the plan's steps finish within its budget or hours (under --steps: within the planned hours)
    finish_probability: float | None = Field(default=None, ge=0, le=1, **Finite)


class LaunchPlan(_Strict):
    run_dir: str
    command: list[str]


class Plan(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    created_by: str
    request: PlanRequest
    hardware: HardwarePlan
    model: ModelPlan
    training: TrainingPlan
    memory: MemoryPlan
    throughput: ThroughputPlan
    budget: BudgetPlan
    schedule: SchedulePlan
    launch: LaunchPlan
    spot: SpotPlan | None = None
    warnings: list[str] = []
    uncertainty: UncertaintyPlan | None = None   # absent in plans written before issue 29


def run_dir_problem(raw: str) -> str | None:
    """Why a plan file may not name this run dir, or None. A plan may be someone else's file, so the directory
    it names must be relative and free of '..' (it lands under the current directory); any other place is asked
    for on the command line (`nanoplan run --run-dir`). `estimate` refuses to write such a plan, `run` such a file."""
    p = Path(raw)
    if not raw.strip() or p.is_absolute() or ".." in p.parts or raw.startswith("~"):
        return (f"is {raw!r}; a plan file may only name a run dir inside the current directory "
                "(relative, without '..')")
    return None


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, then rename over the target."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_plan(plan: Plan, path: str | Path) -> None:
    atomic_write_text(path, plan.model_dump_json(indent=2) + "\n")


def load_plan(path: str | Path) -> Plan:
    """Read and schema-check a plan.json. Raises PlanError with one line naming the field."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise PlanError(str(p), f"cannot read: {e.strerror}", "give the path of a plan.json") from None
    try:
        data = strict_json_loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PlanError(str(p), "is not UTF-8 text", "regenerate it with nanoplan estimate --out") from None
    except json.JSONDecodeError as e:
        raise PlanError(str(p), f"is not valid JSON ({e.msg} at line {e.lineno})",
                        "regenerate it with nanoplan estimate --out") from None
    except DuplicateKeyError as e:
        raise PlanError(str(p), f"is not a plan: {e} (JSON keeps only the last one)",
                        "remove the duplicate, or regenerate the plan with nanoplan estimate --out") from None
    except (ValueError, RecursionError) as e:   # a 5000-digit number; nesting deeper than Python's stack
        raise PlanError(str(p), f"is not a plan ({str(e).split(';')[0][:120]})",
                        "regenerate it with nanoplan estimate --out") from None
    if not isinstance(data, dict):
        raise PlanError(str(p), "must hold a JSON object", "regenerate it with nanoplan estimate --out")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise PlanError(f"{p}: field 'schema_version'", f"is {echo(data.get('schema_version'))}, this nanoplan reads {SCHEMA_VERSION}",
                        "regenerate the plan with this version of nanoplan")
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise PlanError(str(p), pydantic_one_line(e).removeprefix(": "), "fix the field or regenerate the plan") from None


# --------------------------------------------------------------------------- identity

UNTRAINED = ("launch", "created_by", "warnings", "uncertainty")   # top-level fields that do not change what a plan trains


def trained_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """A plan document (JSON types) without the fields that do not change what it trains (and run_dir).

    The default trainer (nanoplan's runner) is left out too, so a plan written before the field
    existed keeps its hash (checkpoints and the launch ledger are keyed by it)."""
    d = {k: v for k, v in doc.items() if k not in UNTRAINED}
    if isinstance(d.get("request"), dict):
        d["request"] = {k: v for k, v in d["request"].items()
                        if k != "run_dir" and not (k == "trainer" and v == DEFAULT_TRAINER.model_dump(mode="json"))}
    return _without_unset(d)


# Fields added after plans were first written (spot GPUs): left out of a plan's identity while unset, so that a
# plan.json written before them hashes as it did (its checkpoints still resume).
_LATER_FIELDS = (("spot",), ("request", "spot"), ("request", "profile", "storage_gb_s"),
                 ("request", "profile", "prices", "*", "spot"), ("request", "trainer", "window_pattern"),
                 ("training", "data_parallel"), ("training", "hsdp_shard"), ("request", "startup_seconds"))
# Fields added later with a default that is not None (issue 29: tensor parallelism): left out at that default.
_LATER_DEFAULTS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("request", "tp"), 1), (("request", "sequence_parallel"), True),
    (("training", "tp"), 1), (("training", "sequence_parallel"), True))


def _without_unset(doc: dict[str, Any]) -> dict[str, Any]:
    def drop(node: Any, path: tuple[str, ...]) -> None:
        if path[0] == "*":
            for item in node if isinstance(node, list) else []:
                drop(item, path[1:])
        elif isinstance(node, dict):
            if len(path) == 1:
                if path[0] in node and node[path[0]] is None:
                    del node[path[0]]
            elif path[0] in node:
                drop(node[path[0]], path[1:])

    out = json.loads(json.dumps(doc))
    for path in _LATER_FIELDS:
        drop(out, path)
    for path, default in _LATER_DEFAULTS:
        parent = out
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and path[-1] in parent and parent[path[-1]] == default:
            del parent[path[-1]]
    return out


def plan_doc(plan: Plan) -> dict[str, Any]:
    """What a plan trains: every field except launch, run_dir, created_by and warnings (JSON types)."""
    return trained_fields(plan.model_dump(mode="json"))


def doc_sha(doc: Any) -> str:
    """sha256 of a JSON document's canonical form (sorted keys, no spaces)."""
    import hashlib  # noqa: PLC0415  (only plans that are hashed pay for it)

    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def plan_hash(plan: Plan) -> str:
    """sha256 of what a plan trains (plan_doc)."""
    return doc_sha(plan_doc(plan))


# --------------------------------------------------------------------------- what a run is, for its budget

# Fields a resumed run may change: how often it checkpoints and how many it keeps (and what follows from them).
RESUME_SAFE_FIELDS = ("request.checkpoint_every_minutes", "request.keep_last", "schedule.checkpoint_every_minutes",
                      "schedule.checkpoint_every_steps", "schedule.num_checkpoints", "schedule.keep_last",
                      "schedule.storage_bytes")


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b.0": leaf} of a nested JSON document (an empty dict or list is a leaf)."""
    if isinstance(doc, dict) and doc:
        return {k: v for key, sub in doc.items() for k, v in flatten(sub, f"{prefix}.{key}" if prefix else str(key)).items()}
    if isinstance(doc, list) and doc:
        return {k: v for i, sub in enumerate(doc) for k, v in flatten(sub, f"{prefix}.{i}" if prefix else str(i)).items()}
    return {prefix: doc}


def budget_key(plan_or_doc: Plan | dict[str, Any]) -> str:
    """What a run IS, for its budget and its checkpoints: plan_hash without RESUME_SAFE_FIELDS (model, data,
    batch, length, budget, hardware, ...; not the cadence or keep_last, which a resume may change). Equal for
    every plan that may resume the run's checkpoints, so a changed cadence never starts a new budget."""
    doc = plan_doc(plan_or_doc) if isinstance(plan_or_doc, Plan) else plan_or_doc
    return doc_sha({k: v for k, v in flatten(doc).items() if k not in RESUME_SAFE_FIELDS})
