"""Candidate runs of a plan search: the grid, and what each setting of it costs (pure Python).

The grid is model size (a depth ladder of one style, or a given list such as presets) ×
micro-batch (every divisor of the per-GPU batch) × strategy (ddp, zero1, zero2, fsdp) ×
activation checkpointing (off, on). `evaluate` keeps the settings that fit the memory model
with headroom, each with its step time; planner.ranking gives them their lengths and ranks them,
and planner.selection.search puts the two together.

Speed: memory and step time are assembled per candidate from per-model and per-strategy
parts computed once with planner.counts / planner.memory / planner.throughput. The assembly
mirrors `build.memory_of` and `throughput.estimate_throughput` term by term; tests/test_search.py
checks it against them for every candidate of several grids, and the chosen plan is always
rebuilt with `build.build_plan` and must fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from planner.build import batch_choices
from planner.counts import flops_per_token, n_params
from planner.errors import PlanError
from planner.fit_verdict import DEFAULT_HEADROOM
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS, allocated_peak
from planner.memory_terms import Optimizer, Precision, StepConfig
from planner.profiles import Hardware
from planner.spec import ModelSpec, style_spec
from planner.throughput import StepModel

DEFAULT_DEPTHS = tuple(range(2, 65, 2))
FRESH_EPOCHS = 4.0   # Muennighoff et al. 2023: up to ~4 epochs are about as good as fresh data
STYLE_VOCAB = {"nanochat": 65536, "custom": 65536, "gpt2": 50257, "llama": 32000}


@dataclass(frozen=True)
class Length:
    """What bounds the run: exactly one of a dollar budget, hours or optimizer steps."""

    budget_usd: float | None = None
    hours: float | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        given = [n for n, v in (("--budget", self.budget_usd), ("--hours", self.hours), ("--steps", self.steps))
                 if v is not None]
        if len(given) != 1:
            raise PlanError(", ".join(given) or "--budget", "exactly one of --budget, --hours or --steps must "
                            f"set the run's length; got {', '.join(given) or 'none'}", "e.g. --budget 1000")
        v = self.budget_usd if self.budget_usd is not None else self.hours if self.hours is not None else self.steps
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise PlanError(given[0], f"must be a positive finite number, got {v!r}")


@dataclass(frozen=True)
class Settings:
    """Request fields the search keeps fixed (the CLI's values)."""

    total_batch_tokens: int = 524_288
    precision: Precision = "bf16-autocast"
    optimizer: Optimizer = "adamw"
    loss_chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS
    headroom: float = DEFAULT_HEADROOM
    mfu: float | None = None
    dataset_tokens: int | None = None
    max_epochs: float | None = FRESH_EPOCHS   # with a dataset: never plan more epochs than this
    compile: bool | None = None               # torch.compile; None: on for GPUs, off for CPU (the runner's default)
    startup_seconds: float | None = None      # a launch's start-up and compile, measured; None: planner/startup.py


class Candidate(NamedTuple):
    """One evaluated (model, micro-batch, strategy, checkpointing) choice."""

    spec: ModelSpec
    n_params: int
    device_batch: int
    grad_accum: int
    strategy: str
    activation_checkpointing: bool
    mem_bytes: int
    step_seconds: float
    tokens_per_sec: float
    steps: int
    tokens: int
    hours: float
    usd: float
    loss: float
    epochs: float | None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.n_params

    @property
    def settings_label(self) -> str:
        return self.strategy + ("+AC" if self.activation_checkpointing else "")


@dataclass
class SearchResult:
    """All fitting candidates, best first, with what the search looked at."""

    hw: Hardware
    objective: str
    settings: Settings
    length: Length
    models: tuple[ModelSpec, ...]
    micro_batches: tuple[int, ...]
    strategies: tuple[str, ...]
    ac_options: tuple[bool, ...]
    ranked: list[Candidate]
    evaluated: int
    capacity: float
    seconds: float
    spend_hours: float = 0.0   # the length every run of a budget/hours search was given (before --max-epochs)
    run_hours: float = 0.0     # the length the budget or --hours allows
    size_cap: int | None = None   # with a dataset: the params of the model chosen with unlimited data (loss, value)

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def compiled(self) -> bool:
        """Whether the searched runs compile (GPU plans do unless the settings say otherwise)."""
        s = self.settings.compile
        return self.hw.profile.kind == "gpu" if s is None else s

    def per_model(self) -> list[Candidate]:
        """The best candidate of each model, in rank order."""
        seen: set[ModelSpec] = set()
        out = []
        for c in self.ranked:
            if c.spec not in seen:
                seen.add(c.spec)
                out.append(c)
        return out


class Grid(NamedTuple):
    """The fitting settings of a grid, each (spec, params, micro-batch, accumulation steps, strategy,
    checkpointing, bytes per GPU, step seconds), with what the grid held."""

    fitting: list[tuple]
    micro_batches: tuple[int, ...]
    evaluated: int
    capacity: float
    usd_per_hour: float


def depth_ladder(style: str = "nanochat", depths: Sequence[int] = DEFAULT_DEPTHS, seq_len: int = 2048,
                 vocab_size: int | None = None) -> tuple[ModelSpec, ...]:
    """Depth-scaled members of a style (d_model = 64·depth); depths with no valid shape are skipped."""
    if style not in STYLE_VOCAB:
        raise PlanError("--style", f"unknown style {style!r}", "choose nanochat, gpt2 or llama")
    vocab = vocab_size or STYLE_VOCAB[style]
    out = []
    for d in depths:
        try:
            out.append(style_spec(style, d, seq_len, vocab))  # type: ignore[arg-type]
        except ValueError:   # e.g. an odd head_dim under rotary: that depth has no valid shape
            continue
    if not out:
        raise PlanError("--depth", f"no valid {style} model among depths {list(depths)[:8]}", "use even depths")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _ModelParts:
    P: int          # parameters
    f_tok: int      # training FLOPs per token
    mfu: float


def _model_parts(spec: ModelSpec, s: Settings, hw: Hardware) -> _ModelParts:
    P = n_params(spec)
    return _ModelParts(P=P, f_tok=flops_per_token(spec), mfu=s.mfu if s.mfu is not None else hw.profile.mfu_for(P))


def evaluate(models: Sequence[ModelSpec], hw: Hardware, length: Length, settings: Settings,
             strategies: Sequence[str], ac_options: Sequence[bool], device_batch: int | None) -> Grid:
    """Every setting of the grid on `hw`: memory per GPU, and for those that fit, the step time."""
    if not models:
        raise PlanError("models", "the search needs at least one model", "give --depth, --preset or a style")
    seq_lens = {m.seq_len for m in models}
    if len(seq_lens) != 1:
        raise PlanError("--seq-len", "all searched models must share one seq_len", "give --seq-len")
    T = seq_lens.pop()
    g = hw.num_gpus
    usd_per_hour = g * hw.usd_per_gpu_hour
    if length.budget_usd is not None and usd_per_hour <= 0:
        raise PlanError("--budget", f"the price of {hw.spec} is $0/h, so a dollar budget sets no length",
                        "give --price USD_PER_GPU_HOUR, --hours H or --steps N")
    tb = settings.total_batch_tokens
    choices = batch_choices(tb, T, g)
    if device_batch is not None:
        if device_batch not in choices:
            raise PlanError("--device-batch-size", f"{device_batch} does not divide the per-GPU batch of "
                            f"{choices[0]} sequences", f"use one of {', '.join(map(str, choices[:8]))}")
        choices = [device_batch]

    prof = hw.profile
    is_gpu = prof.kind == "gpu"
    ov = prof.overheads
    fixed_over = (ov.cuda_context_bytes if is_gpu else 0) + (ov.nccl_bytes if g > 1 and is_gpu else 0)
    frag = ov.fragmentation if is_gpu else 0.0
    capacity = prof.usable_bytes * (1.0 - settings.headroom)
    chunk = settings.loss_chunk_tokens
    compiled = is_gpu if settings.compile is None else settings.compile

    fitting: list[tuple] = []     # (spec, P, b, accum, strategy, ac, bytes, step seconds), lengths come after
    evaluated = 0
    for spec in models:
        mp = _model_parts(spec, settings, hw)
        P = mp.P
        per_b = [(b, tb // (b * T * g)) for b in choices]     # per micro-batch: accumulation steps
        for strat in strategies:
            # planner.throughput's step model, the same code estimate_throughput reports
            sm = StepModel(spec, hw, precision=settings.precision, optimizer=settings.optimizer, strategy=strat,
                           compiled=compiled, loss_chunk_tokens=chunk, tokens_per_step=tb, mfu=settings.mfu)
            for ac in ac_options:
                for b, accum in per_b:
                    evaluated += 1
                    alloc = allocated_peak(StepConfig(  # planner.memory's cached fast path (= estimate)
                        spec=spec, device_batch_size=b, grad_accum_steps=accum, dp=g, precision=settings.precision,
                        optimizer=settings.optimizer, strategy=strat, activation_checkpointing=ac,  # type: ignore[arg-type]
                        loss_chunk_tokens=chunk, compile=compiled))
                    total = alloc + fixed_over + (int(alloc * frag) if frag else 0)
                    if total > capacity:
                        continue
                    step_s = sm.seconds(b, accum, ac)
                    fitting.append((spec, P, b, accum, strat, ac, total, step_s))

    return Grid(fitting, tuple(choices), evaluated, capacity, usd_per_hour)
