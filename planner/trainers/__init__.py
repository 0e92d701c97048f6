"""Plans for the trainers people already use: nanochat, torchtitan and DeepSpeed (issue 21).

A plan's `request.trainer` (planner.plan.TrainerRef) names whose training step it models. The
default, nanoplan, is this project's runner and none of this package is used. For another trainer
a `Trainer` here says, with a source for each part, what that trainer's step does:

- which models and settings it can express (`problems`: anything else is refused, exit 2);
- the request fields that describe its step to the planner (`request_fields`: strategy, optimizer,
  precision, compile, loss chunking), so planner/throughput.py and planner/memory*.py are reused;
- its memory per GPU (`memory`): the planner's own step model (planner.memory.estimate) for the
  parts the trainer shares with the runner, plus what it does differently (nanochat: a bf16 token
  embedding, sharded optimizer state and full logits; torchtitan: fp32 sharded state under FSDP2 mixed
  precision and its activation-checkpoint modes; DeepSpeed: ZeRO's fp32 master state and buckets);
- its parameter and FLOP counts (`counts`); its launch command and files are in launch_files.py;
- the model flags it plans (`model_for`, `model_hint`: nanochat's --depth, torchtitan's --preset), what to try when
  the first plan does not fit (`fallbacks`, `plan_label`) and, when nothing does, why (`no_fit_note`) and its own
  smaller models (`smaller_models`: nanochat's depths), so planner/trainer_fit.py names no trainer;
- its own recipe where it differs from the runner's: a default total batch (`default_total_batch`), where its
  step computes differently (`step_variant`: sliding windows, an FP8 head), how it names a strategy
  (`strategy_label`), and where its launch sets expandable_segments (`allocator_sets`: the fit verdict's advice).

planner/build.py calls `trainer_for(ref)` for memory, model counts, speed, the fit verdict and the launch; this
package never imports planner.build, so there is no cycle. Per-trainer modules: nanochat.py,
torchtitan.py, deepspeed.py; exported launch files: planner/trainers/launch_files.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.counts import flops_per_token, matmul_params, n_params, param_counts
from planner.errors import PlanError
from planner.fit_verdict import Allocator
from planner.kernels import StepSoftware
from planner.memory_terms import MemoryEstimate, StepConfig
from planner.plan import Plan, PlanRequest, TrainerRef
from planner.profiles import HardwareProfile
from planner.scaling import TOKENS_PER_PARAM
from planner.spec import ModelSpec
from planner.units import fmt_count

if TYPE_CHECKING:
    from planner.compute_model import StepVariant
    from planner.profiles import HardwareProfile

TRAINERS = ("nanoplan", "nanochat", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Version:
    """One named version of a trainer: what its plans model and its exports target."""

    key: str            # what --trainer-version takes, and what a plan records
    ref: str            # a 40-hex commit, or a release on the package index
    date: str           # YYYY-MM-DD
    label: str          # a few words: "first release", "current", ...
    source: str         # where the facts were read: repository (or package) and paths


@dataclass(frozen=True)
class Checkout:
    """A trainer run from a git checkout rather than an installed package (planner/export_node.py): the variable
    naming it, a file every checkout has, how to make its environment inside it, and where that is shown."""

    env: str                       # NANOCHAT_DIR
    marker: str                    # scripts/base_train.py
    env_setup: tuple[str, ...]     # shell lines run inside the checkout
    setup_hint: str                # for a SLURM script, where the checkout's environment and data come from


@dataclass(frozen=True)
class Counts:
    """What ModelPlan records: the trainer's own model, counted as the trainer builds it."""

    n_params: int
    by_group: dict[str, int]
    matmul_params: int
    flops_per_token: int


class Trainer:
    """A trainer's step, as the planner sees it. Subclasses fill in the facts."""

    name = ""
    repo = ""
    versions: tuple[Version, ...] = ()
    default_version = ""
    # where the trainer turns on the CUDA allocator's expandable segments itself ("": it does not); planner.fit_verdict
    allocator_sets = ""
    # q, k, v (and SwiGLU's gate and up) as separate linears: which matmuls op-level checkpointing recomputes
    separate_projections = False
    # runs hsdp and tensor parallelism (planner/parallelism.py); the others are refused
    hybrid_parallel = False

    @property
    def allocator(self) -> Allocator:
        return Allocator(self.name, self.allocator_sets)

    # ---------------------------------------------------------------- versions

    def version(self, key: str | None) -> Version:
        """The version named `key` (its key, or a prefix of 7+ hex of its commit); the default for None."""
        want = key or self.default_version
        for v in self.versions:
            if want == v.key or (len(want) >= 7 and v.ref.startswith(want)):
                return v
        known = ", ".join(f"{v.key} ({v.label}, {v.ref[:12]})" for v in self.versions)
        raise PlanError("--trainer-version", f"{self.name} has no version {want!r} that nanoplan models",
                        f"choose one of {known}")

    # ---------------------------------------------------------------- the model a plan names

    # how a user names this trainer's model, for the refusal when none is named (estimate --trainer)
    model_hint = "give --preset, --depth or --n-layer/--d-model/--n-head"

    def model_for(self, version: str, *, depth: int | None, preset: str | None, seq_len: int | None,
                  vocab: int | None) -> ModelSpec | None:
        """The trainer's own model for --depth or --preset (nanochat's depths, torchtitan's flavours); None: the
        model comes from the usual flags."""
        return None

    def smaller_models(self, spec: ModelSpec, version: str) -> list[tuple[str, ModelSpec]]:
        """(label, model) of this trainer's own models below `spec`, largest first, for "the largest that fits"
        when nothing fits (nanochat's depths); [] where the trainer has no ladder of its own."""
        return []

    # ---------------------------------------------------------------- when the first choice does not fit

    # a sentence on why a smaller micro-batch cannot rescue a plan that does not fit ("": it can)
    no_fit_note = ""

    def fallbacks(self, user: dict[str, Any]) -> list[dict[str, Any]]:
        """Settings to try, in order, when the first plan does not fit: only what the user left open (None in
        `user`), each a dict of request choices laid over `user`."""
        return []

    def plan_label(self, req: PlanRequest) -> str:
        """How a tried plan is named in the sentences that say which one fits ("zero1", "fsdp with full activation
        checkpointing")."""
        return self.name

    # ---------------------------------------------------------------- what the trainer can express

    def problems(self, req: PlanRequest, num_gpus: int, nodes: int, gpu_kind: str) -> list[tuple[str, str, str]]:
        """(field, why the trainer cannot do it, fix) for each part of `req` it cannot express."""
        raise NotImplementedError

    def request_fields(self, user: dict[str, Any], num_gpus: int, version: str | None,
                       profile: HardwareProfile | None = None) -> dict[str, Any]:
        """The request fields that describe this trainer's step: `user` holds what the user chose (None where
        they left it open: strategy, optimizer, precision, compile, activation_checkpointing, ac_mode);
        choices the trainer cannot express are kept, for `problems` to refuse. `profile`: the GPU, where a
        choice follows it (nanochat's window pattern)."""
        raise NotImplementedError

    def default_total_batch(self, spec: ModelSpec, version: str | None) -> int | None:
        """Tokens per optimizer step when the user gives none: the trainer's own rule, or None for nanoplan's
        default (524,288)."""
        return None

    def strategy_label(self, strategy: str) -> str:
        """How the trainer names a strategy (DeepSpeed: ZeRO-3 for fsdp)."""
        return strategy

    def step_variant(self, req: PlanRequest) -> StepVariant | None:
        """Where the step computes differently from the runner's (planner.compute_model.StepVariant), or None."""
        return None

    # ---------------------------------------------------------------- its launch files and cluster nodes

    def export_notes(self, plan: Plan) -> list[str]:
        """What `export --for` says beside the files: the settings a file of this trainer cannot comment on."""
        return []

    # a checkout to clone on a cluster node (None: an installed package, the release or commit the plan models)
    checkout: Checkout | None = None

    def node_data_setup(self, plan: Plan) -> list[str]:
        """Shell lines that fetch the trainer's own data and tokenizer on a cluster node (its checkout's tools)."""
        return []

    # ---------------------------------------------------------------- the step

    def memory(self, cfg: StepConfig, ref: TrainerRef, overheads: dict[str, int], fragmentation: float) -> MemoryEstimate:
        raise NotImplementedError

    def step_software(self, spec: ModelSpec, ref: TrainerRef, prof: HardwareProfile) -> StepSoftware | None:
        """The attention kernel and span the trainer's step runs on this GPU, for the step-time model
        (planner/kernels.py). None: what nanoplan's runner runs (torch's default SDPA backend)."""
        return None

    def counts(self, spec: ModelSpec, ref: TrainerRef) -> Counts:
        """By default the planner's own counts (the trainer builds the same module tree)."""
        return Counts(n_params=n_params(spec), by_group=param_counts(spec).as_dict(),
                      matmul_params=matmul_params(spec), flops_per_token=flops_per_token(spec))

    def ratio_params(self, spec: ModelSpec, ref: TrainerRef) -> tuple[int, str]:
        """(parameters, their name) that tokens/param counts: every parameter (Chinchilla's count), unless the
        trainer has its own (nanochat 2026-07: its "scaling params"). The plan's tokens_per_param, its warnings,
        the summary and the default length all use this one count."""
        return self.counts(spec, ref).n_params, "param"

    def default_steps(self, spec: ModelSpec, ref: TrainerRef, tokens_per_step: int) -> tuple[int, str]:
        """(steps, why) of a run given no length: the trainer's own rule, where it has one; else Chinchilla's
        20 tokens per parameter."""
        return chinchilla_steps(self.counts(spec, ref).n_params, tokens_per_step)



def chinchilla_steps(n_params: int, tokens_per_step: int) -> tuple[int, str]:
    """(steps, why) for Chinchilla's rule of thumb, 20 tokens per parameter (Hoffmann et al. 2022 count every
    parameter), rounded up to whole steps."""
    return (max(1, -(-round(TOKENS_PER_PARAM * n_params) // tokens_per_step)),
            f"{TOKENS_PER_PARAM:.0f} tokens per parameter (Chinchilla's rule), over all {fmt_count(n_params)} parameters")


def with_overheads(allocated: int, peak_phase: str, breakdown: dict[str, int], phases: dict[str, int],
                   overheads: dict[str, int], fragmentation: float) -> MemoryEstimate:
    """A MemoryEstimate with the profile's overheads, as planner.memory.estimate adds them."""
    over = dict(overheads)
    if fragmentation:
        over["fragmentation"] = int(allocated * fragmentation)
    return MemoryEstimate(breakdown=breakdown, phases=phases, peak_phase=peak_phase, allocated_peak=allocated,
                          overhead=over)


def trainer_for(ref: TrainerRef | None) -> Trainer | None:
    """The Trainer for a plan's trainer; None for nanoplan's own runner (the default)."""
    if ref is None or ref.name == "nanoplan":
        return None
    if ref.name == "nanochat":
        from planner.trainers.nanochat import NANOCHAT  # noqa: PLC0415
        return NANOCHAT
    if ref.name == "torchtitan":
        from planner.trainers.torchtitan import TORCHTITAN  # noqa: PLC0415
        return TORCHTITAN
    from planner.trainers.deepspeed import DEEPSPEED  # noqa: PLC0415
    return DEEPSPEED


def step_speed_inputs(req: PlanRequest, prof: HardwareProfile) -> tuple[StepVariant | None, StepSoftware | None]:
    """What the plan's trainer computes differently from the runner (`step_variant`: sliding windows, an FP8 head) and
    the attention software it runs on this GPU (`step_software`), for planner.throughput; (None, None) for the
    runner. planner/build.py prices every plan with these, and benchmarks/public_runs predicts nanochat's public rows
    through the same call."""
    tr = trainer_for(req.trainer)
    if tr is None:
        return None, None
    return tr.step_variant(req), tr.step_software(req.model, req.trainer, prof)


def strategy_label(ref: TrainerRef | None, strategy: str) -> str:
    """The plan's strategy in its trainer's words (DeepSpeed's ZeRO-3 for nanoplan's fsdp)."""
    tr = trainer_for(ref)
    return tr.strategy_label(strategy) if tr is not None else strategy


def default_total_batch(name: str, version: str | None, spec: ModelSpec | None, default: int) -> int:
    """The tokens per step when the user gives none: the trainer's own rule (nanochat 2026-07) or `default`."""
    tr = trainer_for(TrainerRef(name=name))   # type: ignore[arg-type]
    if tr is None or spec is None:
        return default
    return tr.default_total_batch(spec, version) or default


def refuse_first(problems: list[tuple[str, str, str]], trainer: str, version: str) -> None:
    """Raise the first problem as a one-line PlanError naming the trainer and version."""
    if problems:
        field, why, fix = problems[0]
        raise PlanError(field, f"{trainer} {version} cannot express this: {why}", fix)


__all__ = ["TRAINERS", "Checkout", "Counts", "Trainer", "Version", "chinchilla_steps", "default_total_batch", "refuse_first",
           "step_speed_inputs", "strategy_label", "trainer_for", "with_overheads"]
