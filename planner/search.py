"""Plan search: the best run for a budget on one hardware configuration (pure Python).

The search enumerates model size (a depth ladder of one style, or a given list such as
presets) × micro-batch (every divisor of the per-GPU batch) × strategy (ddp, zero1, zero2,
fsdp) × activation checkpointing (off, on). It keeps the candidates that fit the memory
model with headroom and ranks them by an objective:

- loss: lowest predicted loss L(N', D') (planner.scaling: Muennighoff et al.'s data-constrained
  fit), models compared at equal spend: the whole budget, or with a dataset the largest spend
  whose best model stays within --max-epochs (docs/planning.md explains why);
- value: the cheapest run whose predicted loss is within VALUE_TOL (0.5%) of the loss objective's;
- max-model: most parameters, then most tokens;
- throughput: most tokens (then shortest step);
- chinchilla: the model whose fastest setting lands closest to 20 tokens/param (in ratio),
  then that fastest setting.

Ties on the objective go to the simpler settings: no checkpointing before checkpointing, then
the bigger micro-batch (fewer accumulation steps), then ddp before zero1/zero2/fsdp. On several
GPUs zero1 comes before ddp: it keeps 1/dp of the optimizer state per GPU and its only extra cost, the broadcast of the
updated parameters, is modelled (planner/throughput.py), so where that keeps it within
SETTINGS_TOL of the fastest it is the default (a pinned --strategy ddp still stands; CPU
profiles keep ddp first). Within one model and run
length, settings whose step time is within SETTINGS_TOL of the fastest count as ties too:
the step-time model cannot resolve smaller differences (docs/throughput.md), so a setting must
be more than that much faster to beat a simpler one (e.g. a smaller micro-batch).

Speed: memory and step time are assembled per candidate from per-model and per-strategy
parts computed once with planner.counts / planner.memory / planner.throughput. The assembly
mirrors `build.memory_of` and `throughput.estimate_throughput` term by term; tests/test_search.py
checks it against them for every candidate of several grids, and the chosen plan is always
rebuilt with `build.build_plan` and must fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any, NamedTuple

from planner.build import batch_choices, build_plan, memory_of
from planner.counts import flops_per_token, matmul_params, matrix_params, n_params
from planner.errors import PlanError
from planner.fit_verdict import DEFAULT_HEADROOM
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS, allocated_peak, estimate
from planner.memory_eager import layer_activation_bytes
from planner.memory_terms import STRATEGIES, Optimizer, Precision, StepConfig, precision_bytes
from planner.plan import Plan, PlanRequest
from planner.profiles import Hardware, parse_gpu_spec
from planner.scaling import (
    R_STAR_D,
    R_STAR_N,
    chinchilla_distance,
    data_optimal_params,
    data_term,
    effective_tokens,
    model_term,
)
from planner.spec import ModelSpec, style_spec
from planner.throughput import StepModel, Throughput, estimate_throughput
from planner.units import fmt_bytes, fmt_count

OBJECTIVES = ("loss", "value", "max-model", "throughput", "chinchilla")
STRATEGY_RANK = {s: i for i, s in enumerate(STRATEGIES)}
# several GPUs: zero1 shards the optimizer state at a modelled cost, so among ties it goes first
MULTI_GPU_RANK = {s: i for i, s in enumerate(("zero1", "ddp", "zero2", "fsdp"))}
DEFAULT_DEPTHS = tuple(range(2, 65, 2))
SETTINGS_TOL = 0.01  # relative step time: assumption; the throughput model's assumed constants (LAUNCH_SECONDS,
                     # kernel counts, OVERLAP) move step times by more than this (docs/throughput.md)
# relative: --objective value takes the cheapest run within this of the lowest predicted loss, and the loss
# objective names such a run when it is much cheaper; the fit's own uncertainty is larger (Besiroglu et al. 2024)
VALUE_TOL = 0.005
MUCH_CHEAPER = 0.8   # "much less": at most 80% of the winner's cost
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

    def per_model(self) -> list[Candidate]:
        """The best candidate of each model, in rank order."""
        seen: set[ModelSpec] = set()
        out = []
        for c in self.ranked:
            if c.spec not in seen:
                seen.add(c.spec)
                out.append(c)
        return out


def zero1_first(hw: Hardware) -> bool:
    """Whether zero1 goes before ddp among ties: several GPUs (CPU profiles, for tests and
    development, keep ddp first)."""
    return hw.num_gpus > 1 and hw.profile.kind == "gpu"


def tie_break(c: Candidate, shard_first: bool = False) -> tuple:
    """Simpler first: no checkpointing first, then the bigger micro-batch (fewer accumulation steps), then
    the simpler strategy (ddp before sharding; `shard_first`, several GPUs: zero1, then ddp)."""
    rank = MULTI_GPU_RANK if shard_first else STRATEGY_RANK
    return (c.activation_checkpointing, -c.device_batch, rank[c.strategy])


def objective_key(objective: str, c: Candidate) -> tuple:
    if objective in ("loss", "value"):   # at equal spend (search sets each objective's spend)
        return (c.loss,)
    if objective == "max-model":
        return (-c.n_params, -c.tokens, c.step_seconds)
    if objective == "throughput":
        return (-c.tokens, c.step_seconds)
    if objective == "chinchilla":
        return (chinchilla_distance(c.tokens_per_param), -c.tokens)
    raise PlanError("--objective", f"unknown objective {objective!r}", f"choose one of {', '.join(OBJECTIVES)}")


def length_key(c: Candidate, run_hours: float | None) -> tuple:
    """Candidates of one model with the same key ran for the same length: the budget's or the
    --hours' full time (run_hours), or a number of steps (--steps, an epoch cap or an epoch stop)."""
    return ("hours", c.hours) if run_hours is not None and c.hours == run_hours else ("steps", c.steps)


def prefer_simpler(ranked: list[Candidate], tol: float, run_hours: float | None,
                   shard_first: bool = False) -> list[Candidate]:
    """Move each model's simplest near-fastest setting to the place of its best one.

    For the first (best) candidate f of each model, its siblings (same model, same `length_key`)
    whose step time is within (1 + tol) of f's tie with it; the simplest of them by `tie_break`
    takes f's place. Only the order changes: every candidate keeps its own numbers.
    """
    first: dict[int, tuple[int, tuple, float]] = {}   # id(spec) -> (its best's index, length key, step limit)
    for i, c in enumerate(ranked):
        if id(c.spec) not in first:
            first[id(c.spec)] = (i, length_key(c, run_hours), c.step_seconds * (1.0 + tol))
    pick: dict[int, tuple[tuple, int]] = {}          # id(spec) -> (tie_break, index) of the simplest tied sibling
    for j, c in enumerate(ranked):
        i, lk, limit = first[id(c.spec)]
        if j != i and c.step_seconds <= limit and length_key(c, run_hours) == lk:
            tb = tie_break(c, shard_first)
            if tb < tie_break(ranked[i], shard_first) and (id(c.spec) not in pick or tb < pick[id(c.spec)][0]):
                pick[id(c.spec)] = (tb, j)
    if not pick:
        return ranked
    moves = {first[sid][0]: j for sid, (_, j) in pick.items()}
    taken = set(moves.values())
    out = []
    for i, c in enumerate(ranked):
        if i in moves:
            out.append(ranked[moves[i]])
        if i not in taken:
            out.append(c)
    return out


def rank_key(objective: str, c: Candidate) -> tuple:
    return objective_key(objective, c) + tie_break(c)


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
    P: int
    f_tok: int
    mfu: float
    opt_elems: int
    cast_cache: int
    per_layer: int
    layer_tok: int       # saved activation bytes per token per block
    stream_tok: int      # residual-stream bytes per token (block input, final norm input)


def _model_parts(spec: ModelSpec, s: Settings, hw: Hardware) -> _ModelParts:
    _, a, r = precision_bytes(s.precision)
    P = n_params(spec)
    if s.optimizer == "adamw":
        opt_elems = 2 * P
    else:
        M = matrix_params(spec)
        opt_elems = M + 2 * (P - M)
    return _ModelParts(
        P=P, f_tok=flops_per_token(spec), mfu=s.mfu if s.mfu is not None else hw.profile.mfu_for(P),
        opt_elems=opt_elems, cast_cache=2 * matmul_params(spec) if s.precision == "bf16-autocast" else 0,
        per_layer=(P - spec.vocab_size * spec.d_model * (1 if spec.tied else 2)) // max(spec.n_layer, 1),
        layer_tok=layer_activation_bytes(spec, s.precision), stream_tok=r * spec.d_model,
    )


def search(models: Sequence[ModelSpec], hw: Hardware, length: Length, settings: Settings = Settings(), *,
           objective: str = "loss", strategies: Sequence[str] = STRATEGIES,
           ac_options: Sequence[bool] = (False, True), device_batch: int | None = None,
           settings_tol: float = SETTINGS_TOL) -> SearchResult:
    """Evaluate every candidate on `hw`; return the fitting ones ranked by `objective`.

    settings_tol: within a model and run length, settings at most this much slower (relative step time)
    than the best one are ties, won by the simplest (`tie_break`); 0 ranks by the objective alone."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise PlanError("--objective", f"unknown objective {objective!r}", f"choose one of {', '.join(OBJECTIVES)}")
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
    ds = settings.dataset_tokens
    cap_steps = _cap_steps(settings)

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

    run_hours = (length.hours if length.hours is not None else
                 length.budget_usd / usd_per_hour if length.budget_usd is not None else 0.0)
    spend_hours, ranked, size_cap = _choose(fitting, objective, length.steps, run_hours, tb, ds, cap_steps,
                                            usd_per_hour)
    if settings_tol > 0:
        ranked = prefer_simpler(ranked, settings_tol, spend_hours if length.steps is None else None, zero1_first(hw))
    return SearchResult(hw=hw, objective=objective, settings=settings, length=length, models=tuple(models),
                        micro_batches=tuple(choices), strategies=tuple(strategies), ac_options=tuple(ac_options),
                        ranked=ranked, evaluated=evaluated, capacity=capacity, seconds=time.perf_counter() - t0,
                        spend_hours=spend_hours, run_hours=run_hours, size_cap=size_cap)


def _choose(fitting: list[tuple], objective: str, steps: int | None, run_hours: float, tb: int, ds: int | None,
            cap_steps: int | None, usd_per_hour: float) -> tuple[float, list[Candidate], int | None]:
    """(spend in hours, ranked candidates, size cap) for an objective; see docs/planning.md.

    loss and value with a dataset: the model may not be bigger than the one the same objective picks with
    unlimited data. Where a run would repeat its data but its model is still below the data's compute-optimal
    size, only the repeats are discounted, which favours a bigger model on fewer tokens; the cap keeps less
    data from ever buying a bigger model."""
    if steps is not None or objective not in ("loss", "value") or not fitting:
        return run_hours, _ranked(fitting, objective, steps, run_hours, tb, ds, cap_steps, usd_per_hour), None
    size_cap = None
    frontier = fitting
    if ds is not None:
        free = _ranked(fitting, objective, None, _spend_hours(fitting, run_hours, tb, None, None, objective), tb,
                       None, None, usd_per_hour)
        size_cap = free[0].n_params
        frontier = [f for f in fitting if f[1] <= size_cap]
    spend = _spend_hours(frontier, run_hours, tb, ds, cap_steps, objective)
    short = spend < run_hours * (1 - 1e-12)   # a shorter run than the budget: its plan pins the steps
    return spend, _ranked(fitting, objective, None, spend, tb, ds, cap_steps, usd_per_hour, size_cap,
                          pinned=short), size_cap


# ---------------------------------------------------------------- lengths and the loss ranking


def _cap_steps(s: Settings) -> int | None:
    """Steps at --max-epochs of the dataset (None without a dataset or a cap)."""
    ds, tb = s.dataset_tokens, s.total_batch_tokens
    return max(1, math.floor(s.max_epochs * ds / tb)) if ds and s.max_epochs else None


def with_objective(result: SearchResult, objective: str, hours: float | None = None) -> SearchResult:
    """The same fitting settings ranked by another objective (or at a given spend); no new memory work."""
    fitting = [(c.spec, c.n_params, c.device_batch, c.grad_accum, c.strategy, c.activation_checkpointing,
                c.mem_bytes, c.step_seconds) for c in result.ranked]
    s, steps = result.settings, result.length.steps
    cap = _cap_steps(s)
    usd_h = result.hw.num_gpus * result.hw.usd_per_gpu_hour
    if hours is not None:
        ranked = _ranked(fitting, objective, steps, hours, s.total_batch_tokens, s.dataset_tokens, cap, usd_h)
        ranked = prefer_simpler(ranked, SETTINGS_TOL, hours if steps is None else None, zero1_first(result.hw))
        return replace(result, objective=objective, ranked=ranked, spend_hours=hours, size_cap=None)
    spend, ranked, size_cap = _choose(fitting, objective, steps, result.run_hours, s.total_batch_tokens,
                                      s.dataset_tokens, cap, usd_h)
    ranked = prefer_simpler(ranked, SETTINGS_TOL, spend if steps is None else None, zero1_first(result.hw))
    return replace(result, objective=objective, ranked=ranked, spend_hours=spend, size_cap=size_cap)


def _steps_at(hours: float, step_s: float) -> int:
    return max(1, math.floor(hours * 3600 / step_s))


def _fastest(fitting: list[tuple]) -> list[tuple[int, float]]:
    """(params, fastest step seconds) of each model that fits."""
    best: dict[ModelSpec, tuple[int, float]] = {}
    for spec, P, *_, step_s in fitting:
        if spec not in best or step_s < best[spec][1]:
            best[spec] = (P, step_s)
    return list(best.values())


def _spend_hours(fitting: list[tuple], run_hours: float, tb: int, ds: int | None, cap_steps: int | None,
                 objective: str) -> float:
    """How long (so how much money) the loss and value objectives spend; see docs/planning.md.

    Models are compared at equal spend, each with its fastest fitting settings (the frame of
    Chinchilla and of Muennighoff et al.: a fixed compute budget split between N and D).
    loss: the whole budget, unless the best model at that spend would need more than
    --max-epochs of the data; then the largest spend whose best model stays within them.
    value: the smallest spend whose best predicted loss is within VALUE_TOL of the loss objective's.
    """
    models = [(P, model_term(P, ds), s) for P, s in _fastest(fitting)]

    def best(hours: float) -> tuple[float, int, int]:
        """(loss, params, steps) of the best model at this spend, without the epoch cap."""
        out = None
        for P, m_term, s in models:
            steps = _steps_at(hours, s)
            key = (m_term + data_term(steps * tb, ds), P, steps)
            if out is None or key < out:
                out = key
        return out  # type: ignore[return-value]

    def within_cap(hours: float) -> bool:
        return cap_steps is None or best(hours)[2] <= cap_steps

    hours = run_hours
    if not within_cap(hours):
        # below this spend no model reaches the cap; search down a geometric grid, then bisect the edge
        floor_h = min(cap_steps * s for _, _, s in models) / 3600   # type: ignore[operator]
        hi = hours
        lo = hours
        while lo > floor_h and not within_cap(lo):
            hi, lo = lo, max(floor_h, lo / 1.25)
        if within_cap(lo):
            for _ in range(40):
                mid = math.sqrt(lo * hi)
                if within_cap(mid):
                    lo = mid
                else:
                    hi = mid
                if hi / lo < 1 + 1e-6:
                    break
        hours = lo
    if objective == "value":
        target = best(hours)[0] * (1 + VALUE_TOL)
        lo, hi = min(s for *_, s in models) / 3600, hours     # one step of the fastest model .. the loss spend
        if best(lo)[0] > target:
            for _ in range(60):
                mid = math.sqrt(lo * hi)
                if best(mid)[0] <= target:
                    hi = mid
                else:
                    lo = mid
                if hi / lo < 1 + 1e-6:
                    break
            hours = hi
        else:
            hours = lo
    return hours


def _ranked(fitting: list[tuple], objective: str, fixed_steps: int | None, hours: float, tb: int, ds: int | None,
            cap_steps: int | None, usd_per_hour: float, size_cap: int | None = None,
            pinned: bool = False) -> list[Candidate]:
    """Give every fitting setting its length (fixed steps, or `hours`, capped at --max-epochs) and rank them.

    pinned: the spend is shorter than the budget, so the plan pins the steps (plan_for_best) and each run
    lasts exactly its whole steps."""
    m_terms: dict[ModelSpec, float] = {}
    keyed: list[tuple[tuple, Candidate]] = []
    for spec, P, b, accum, strat, ac, total, step_s in fitting:
        if spec not in m_terms:
            m_terms[spec] = model_term(P, ds)
        if fixed_steps is None:
            steps = _steps_at(hours, step_s)
            h = steps * step_s / 3600 if pinned else hours
        else:
            steps, h = fixed_steps, fixed_steps * step_s / 3600
        if cap_steps is not None and steps > cap_steps:
            steps, h = cap_steps, cap_steps * step_s / 3600
        tokens = steps * tb
        loss = m_terms[spec] + data_term(tokens, ds)
        c = Candidate(spec, P, b, accum, strat, ac, total, step_s, tb / step_s, steps, tokens, h, h * usd_per_hour,
                      loss, tokens / ds if ds else None)
        base = "throughput" if objective == "chinchilla" else objective   # chinchilla: distance added below
        keyed.append((objective_key(base, c) + tie_break(c), c))
    if objective == "chinchilla":
        # Rank models by how close their fastest setting gets to 20 tokens/param, then the fastest setting:
        # slowing a run down (e.g. needless checkpointing) to hit the ratio would waste the budget.
        most: dict[ModelSpec, int] = {}
        for _, c in keyed:
            most[c.spec] = max(most.get(c.spec, 0), c.tokens)
        keyed = [((chinchilla_distance(most[c.spec] / c.n_params), *key), c) for key, c in keyed]
    if objective == "value" and fixed_steps is not None and keyed:
        # fixed steps: every run has its own cost; the cheapest within VALUE_TOL of the best loss wins
        best_loss = min(c.loss for _, c in keyed)
        keyed = [((c.loss > best_loss * (1 + VALUE_TOL), round(c.usd, 2), *key), c) for key, c in keyed]
    if size_cap is not None:   # models bigger than the cap rank after all the others
        keyed = [((c.n_params > size_cap, *key), c) for key, c in keyed]
    keyed.sort(key=itemgetter(0))
    return [c for _, c in keyed]


# ---------------------------------------------------------------- plans from candidates


def request_for(c: Candidate, base: dict[str, Any]) -> PlanRequest:
    """The PlanRequest that reproduces candidate `c` (base: the other PlanRequest fields)."""
    extra = {"max_epochs": base.get("max_epochs") or FRESH_EPOCHS} if base.get("dataset_tokens") else {}
    return PlanRequest.model_validate({**base, **extra, "model": c.spec, "device_batch_size": c.device_batch,
                                       "strategy": c.strategy, "activation_checkpointing": c.activation_checkpointing})


def plan_for_best(result: SearchResult, base: dict[str, Any], plan_path: str = "plan.json") -> Plan:
    """Build the winner with build_plan; fall back down the ranking if it does not fit there."""
    for c in result.ranked[:50]:
        plan = build_plan(request_for(c, base), plan_path=plan_path)
        if plan.schedule.total_steps != c.steps:
            # the objective chose a shorter run than the budget or hours (value, or a dataset's stop): pin its steps
            short = {**base, "budget_usd": None, "hours": None, "steps": c.steps}
            plan = build_plan(request_for(c, short), plan_path=plan_path)
        if plan.memory.fits:
            return plan
    raise nothing_fits(result)


def _compiled(result: SearchResult) -> bool:
    """Whether the searched runs compile (GPU plans do unless the settings say otherwise)."""
    s = result.settings.compile
    return result.hw.profile.kind == "gpu" if s is None else s


def nothing_fits(result: SearchResult) -> PlanError:
    hw = result.hw
    small = min(result.models, key=n_params)
    cfg = StepConfig(spec=small, device_batch_size=result.micro_batches[-1],
                     grad_accum_steps=result.settings.total_batch_tokens // (result.micro_batches[-1] * small.seq_len * hw.num_gpus),
                     dp=hw.num_gpus, precision=result.settings.precision, optimizer=result.settings.optimizer,
                     strategy="fsdp", activation_checkpointing=True, loss_chunk_tokens=result.settings.loss_chunk_tokens,
                     compile=_compiled(result))
    need = memory_of(cfg, hw).total
    return PlanError("--gpu", f"no searched model fits on {hw.spec}: even {small.name} at micro-batch "
                     f"{cfg.device_batch_size} with fsdp + checkpointing needs {fmt_bytes(need)} > "
                     f"{fmt_bytes(result.capacity)} per GPU", "use more or bigger GPUs, a shorter --seq-len or a smaller --vocab-size")


# ---------------------------------------------------------------- explanations


def _h(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def _min_memory(spec: ModelSpec, result: SearchResult, strategy: str, ac: bool) -> int:
    """Per-GPU bytes of `spec` at the smallest searched micro-batch (for 'does not fit' sentences)."""
    hw, s = result.hw, result.settings
    b = result.micro_batches[-1]
    cfg = StepConfig(spec=spec, device_batch_size=b,
                     grad_accum_steps=s.total_batch_tokens // (b * spec.seq_len * hw.num_gpus), dp=hw.num_gpus,
                     precision=s.precision, optimizer=s.optimizer, strategy=strategy,  # type: ignore[arg-type]
                     activation_checkpointing=ac, loss_chunk_tokens=s.loss_chunk_tokens, compile=_compiled(result))
    return memory_of(cfg, hw).total


def _tpp(c: Candidate) -> str:
    """Tokens/param for sentences: 3 significant figures below 10, 1 decimal below 1000, then commas."""
    x = c.tokens_per_param
    return f"{x:.3g}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def _slower(other: Candidate, best: Candidate) -> str:
    r = other.tokens_per_sec / best.tokens_per_sec - 1
    return f"{-r:.1%} slower" if r <= 0 else f"{r:.1%} faster but worse by the objective"


def _vs(x: float, ref: float) -> str:
    """A loss in a sentence that compares it with `ref`: 3 decimals, 4 when 3 would make them look equal."""
    return f"{x:.3f}" if f"{x:.3f}" != f"{ref:.3f}" or x == ref else f"{x:.4f}"


def _loss_line(c: Candidate) -> str:
    return f"{c.name} ({fmt_count(c.n_params)} params)"


def _data_clause(c: Candidate, ds: int | None) -> str:
    if not ds or c.epochs is None:
        return ""
    return f", {c.epochs:.1f} epochs"


def explain(result: SearchResult) -> list[str]:
    """Why the winner won, in sentences with numbers."""
    best = result.best
    if best is None:
        return [str(nothing_fits(result))]
    s, hw = result.settings, result.hw
    ds = s.dataset_tokens
    models = result.per_model()
    by_n = sorted(models, key=lambda c: c.n_params)
    out = []
    names = [m.name for m in result.models]
    span = f"{names[0]}..{names[-1]}" if len(names) > 1 else names[0]
    out.append(f"Searched {result.evaluated:,} candidates ({len(names)} models {span} × {len(result.micro_batches)} "
               f"micro-batch{'es' if len(result.micro_batches) > 1 else ''} × {len(result.strategies)} strategies × checkpointing "
               f"{'off/on' if len(result.ac_options) > 1 else ('on' if result.ac_options[0] else 'off')}) in "
               f"{result.seconds * 1000:.0f} ms; {len(result.ranked):,} fit in {fmt_bytes(result.capacity)} per GPU "
               f"({s.headroom:.0%} headroom) on {hw.spec}.")
    idx = next(i for i, c in enumerate(by_n) if c.spec == best.spec)
    bigger = by_n[idx + 1] if idx + 1 < len(by_n) else None
    smaller = by_n[idx - 1] if idx > 0 else None
    when = f"at {_h(best.hours)}" if result.length.steps is None else f"in {best.steps:,} steps"
    obj = result.objective
    data_stop = obj == "loss" and ds is not None and result.spend_hours < result.run_hours * (1 - 1e-9)
    if obj == "loss":
        out.append(f"{_loss_line(best)} has the lowest predicted loss{' for this spend' if data_stop else ''}, "
                   f"{_vs(best.loss, (bigger or smaller or best).loss)}: {fmt_count(best.tokens)} tokens "
                   f"({_tpp(best)} tokens/param"
                   f"{_data_clause(best, ds)}) {when} for ${best.usd:,.0f}.")
    elif obj == "value":
        ref = with_objective(result, "loss").best
        assert ref is not None
        out.append(f"{_loss_line(best)} is the cheapest run within {VALUE_TOL:.1%} of the lowest predicted loss: "
                   f"{best.loss:.3f} for ${best.usd:,.0f} ({fmt_count(best.tokens)} tokens, {_tpp(best)} tokens/param"
                   f"{_data_clause(best, ds)}) {when}, against {ref.loss:.3f} for {ref.name} at ${ref.usd:,.0f} "
                   f"({best.loss / ref.loss - 1:.1%} higher, {1 - best.usd / max(ref.usd, 1e-9):.0%} cheaper).")
    elif obj == "max-model":
        out.append(f"{_loss_line(best)} is the biggest model that fits; it sees {fmt_count(best.tokens)} tokens "
                   f"({_tpp(best)} tokens/param{_data_clause(best, ds)}) {when}.")
    elif obj == "throughput":
        out.append(f"{_loss_line(best)} trains on the most tokens: {fmt_count(best.tokens)} at "
                   f"{best.tokens_per_sec:,.0f} tokens/s {when} ({_tpp(best)} tokens/param).")
    else:
        out.append(f"{_loss_line(best)} is closest to 20 tokens/param: {_tpp(best)} "
                   f"({fmt_count(best.tokens)} tokens {when}).")

    bwhen = ""
    if bigger is not None:
        bwhen = f"at {_h(bigger.hours)}" if result.length.steps is None else f"in {bigger.steps:,} steps"
    if obj == "chinchilla":
        for other in (x for x in (bigger, smaller) if x is not None):
            out.append(f"{best.name} beats {other.name}: {other.name} would see {_tpp(other)} "
                       f"tokens/param, further from 20.")
    if bigger is not None and obj in ("loss", "value", "throughput"):
        out.append(f"{best.name} beats {bigger.name}: {bwhen}, {bigger.name} would see only "
                   f"{_tpp(bigger)} tokens/param{_data_clause(bigger, ds)} (predicted loss {_vs(bigger.loss, best.loss)}).")
    if smaller is not None and obj in ("loss", "value"):
        out.append(f"{best.name} beats {smaller.name}: {smaller.name} would see {_tpp(smaller)} "
                   f"tokens/param{_data_clause(smaller, ds)}, but with {fmt_count(smaller.n_params)} params its "
                   f"predicted loss is {_vs(smaller.loss, best.loss)}.")
    biggest = by_n[-1]
    if biggest.spec != best.spec and (bigger is None or biggest.spec != bigger.spec):
        out.append(f"The biggest model that fits, {biggest.name} ({fmt_count(biggest.n_params)} params, "
                   f"{biggest.settings_label}), would see only {_tpp(biggest)} tokens/param "
                   f"(predicted loss {biggest.loss:.3f}).")
    if biggest.spec == best.spec:
        out.append(_why_not_bigger(result, best))
    if obj in ("loss", "value") and result.size_cap is not None:
        over = [c for c in result.ranked if c.n_params > result.size_cap and c.loss < best.loss]
        if over:
            o = min(over, key=lambda c: c.loss)
            out.append(f"{o.name} would predict a lower loss at this spend ({_vs(o.loss, best.loss)}), but with "
                       f"unlimited data the search would pick {fmt_count(result.size_cap)} params, and less data is "
                       f"never a reason for a bigger model: here only the repeats are discounted, which favours "
                       f"bigger models on fewer tokens (docs/planning.md).")
    if obj == "loss":
        out.append(_last_bit(result, best))
        if data_stop:
            out.extend(_data_stop(result, best))
    elif obj != "value":
        lbest = min(result.ranked, key=lambda c: rank_key("loss", c))
        if lbest.spec != best.spec:
            out.append(f"For the lowest predicted loss, --objective loss picks {lbest.name} ({lbest.loss:.3f} vs "
                       f"{best.loss:.3f}).")
    if ds:
        d_eff = effective_tokens(best.tokens, ds)
        if best.tokens > ds:
            out.append(f"With {fmt_count(ds)} unique tokens, {best.tokens / ds:.1f} epochs of {best.name} are worth "
                       f"{fmt_count(d_eff)} fresh tokens ({d_eff / best.tokens:.0%} of {fmt_count(best.tokens)}; "
                       f"Muennighoff et al. 2023, R*_D = {R_STAR_D:.1f}).")
        else:
            out.append(f"The run sees {best.tokens / ds:.2f} of one epoch of the {fmt_count(ds)}-token dataset.")
    out.extend(why_settings(result, best))
    return [x for x in out if x]


def _last_bit(result: SearchResult, best: Candidate) -> str:
    """What the last VALUE_TOL of predicted loss costs, naming the cheaper run when it is much cheaper."""
    v = with_objective(result, "value").best
    if v is None or v.usd >= best.usd * (1 - 1e-9):
        return ""
    gap = v.loss / best.loss - 1
    if v.usd <= best.usd * MUCH_CHEAPER:
        return (f"{v.name} for ${v.usd:,.0f} is within {gap:.1%} of {best.name} for ${best.usd:,.0f} "
                f"(predicted loss {v.loss:.3f} vs {best.loss:.3f}); --objective value picks it.")
    return (f"The last {gap:.1%} of predicted loss costs ${best.usd - v.usd:,.0f} ({1 - v.usd / best.usd:.0%} of "
            f"the run): {v.name} for ${v.usd:,.0f} predicts {v.loss:.3f} (--objective value).")


def _data_stop(result: SearchResult, best: Candidate) -> list[str]:
    """Why a run with a dataset stops before the budget or hours are spent."""
    s = result.settings
    ds, cap = s.dataset_tokens, s.max_epochs
    full = (f"the ${result.length.budget_usd:,.0f} budget" if result.length.budget_usd is not None
            else f"the {_h(result.run_hours)} asked for")
    out = [f"It stops at ${best.usd:,.0f} ({_h(best.hours)}) of {full}: spending more, the best model would need more "
           f"than {cap:g} epochs of the {fmt_count(ds or 0)} unique tokens (--max-epochs; Muennighoff et al. 2023: up "
           f"to ~4 epochs are nearly as good as fresh data, and each repeat beyond is worth less)."]
    more = 4 * cap if cap else 0
    if more:   # what a looser cap would buy: Muennighoff et al. find repeats keep some value up to ~16 epochs
        loose = with_objective(replace(result, settings=replace(s, max_epochs=more)), "loss").best
        if loose is not None and loose.loss < best.loss:
            out.append(f"With --max-epochs {more:g} the search would plan {loose.name} for ${loose.usd:,.0f} "
                       f"({loose.epochs or 0:.1f} epochs), predicted loss {_vs(loose.loss, best.loss)} "
                       f"({1 - loose.loss / best.loss:.1%} lower; repeats keep some value up to ~16 epochs, "
                       f"Muennighoff et al. 2023).")
    alt = with_objective(result, "loss", hours=result.run_hours).best   # every model at the whole budget, capped
    if alt is not None and alt.spec != best.spec and alt.loss < best.loss:
        pin = f"; --depth {alt.spec.n_layer} plans it" if alt.name == f"d{alt.spec.n_layer}" else ""
        out.append(f"Spending more on a bigger model for the same epochs still lowers the predicted loss, far from "
                   f"compute-optimal: {alt.name} for ${alt.usd:,.0f} predicts {alt.loss:.3f} "
                   f"({1 - alt.loss / best.loss:.1%} lower) with {fmt_count(alt.n_params)} params, where "
                   f"{fmt_count(data_optimal_params(ds or 0))} is compute-optimal for {fmt_count(ds or 0)} tokens "
                   f"(the fit's excess-parameter term, R*_N = {R_STAR_N:.1f}){pin}.")
    return out


def _why_not_bigger(result: SearchResult, best: Candidate) -> str:
    specs = sorted(result.models, key=n_params)
    bigger = [m for m in specs if n_params(m) > best.n_params]
    if not bigger:
        return f"{best.name} is the largest model in the search range."
    nxt = bigger[0]
    need = _min_memory(nxt, result, "fsdp", True)
    return (f"{nxt.name} does not fit: even at micro-batch {result.micro_batches[-1]} with fsdp + checkpointing it "
            f"needs {fmt_bytes(need)} > {fmt_bytes(result.capacity)} per GPU.")


def _run_hours(result: SearchResult) -> float | None:
    """The full run length in hours of a budget or --hours search (None for --steps)."""
    ln = result.length
    if ln.hours is not None:
        return ln.hours
    if ln.budget_usd is not None:
        return ln.budget_usd / (result.hw.num_gpus * result.hw.usd_per_gpu_hour)
    return None


def _siblings(result: SearchResult, best: Candidate) -> list[Candidate]:
    """The other settings of the winner's model for the same run length."""
    rh = _run_hours(result)
    key = length_key(best, rh)
    return [c for c in result.ranked if c.spec == best.spec and length_key(c, rh) == key]


def why_settings(result: SearchResult, best: Candidate) -> list[str]:
    """Sentences: why this strategy, checkpointing and micro-batch among the model's fitting settings."""
    same = [c for c in result.ranked if c.spec == best.spec]
    sib = _siblings(result, best)
    out = []
    cap = fmt_bytes(result.capacity)
    tol = f"{SETTINGS_TOL:.0%}"
    fastest = min(sib, key=lambda c: c.step_seconds)
    if fastest.step_seconds < best.step_seconds:
        out.append(f"Settings: the fastest, {fastest.settings_label} at micro-batch {fastest.device_batch}, would be "
                   f"{_pct(fastest.tokens_per_sec / best.tokens_per_sec - 1)} faster; settings within {tol} of the "
                   "fastest are a tie the step-time model cannot resolve, won by the simplest (no checkpointing, the biggest micro-batch, then "
                   + ("zero1, then ddp" if zero1_first(result.hw) else "ddp") + ").")
    # strategy
    if best.strategy == "ddp":
        if result.hw.num_gpus > 1:
            faster = any(c.strategy != "ddp" and c.step_seconds < best.step_seconds for c in sib)
            out.append("Strategy ddp: the model fits unsharded" + ("." if faster else
                       ", and zero1/zero2/fsdp are no faster here (ties go to the simpler setting)."))
    elif best.strategy == "zero1" and (twin := _ddp_twin(sib, best)) is not None:
        out.append(_why_zero1(result, best, twin))
    else:
        ddp = [c for c in sib if c.strategy == "ddp"]
        if ddp:
            d = min(ddp, key=lambda c: c.step_seconds)
            dmax = max(c.device_batch for c in ddp if c.activation_checkpointing == d.activation_checkpointing)
            limit = (f" (the largest micro-batch ddp fits{' with checkpointing' if d.activation_checkpointing else ''})"
                     if d.device_batch == dmax and dmax < best.device_batch else "")
            out.append(f"Strategy {best.strategy}: ddp's fastest setting, micro-batch {d.device_batch}"
                       f"{' + AC' if d.activation_checkpointing else ''}{limit}, is {_slower(d, best)}.")
        else:
            need = _min_memory(best.spec, result, "ddp", True)
            out.append(f"Strategy {best.strategy}: with ddp, {best.name} does not fit (micro-batch "
                       f"{result.micro_batches[-1]} with checkpointing needs {fmt_bytes(need)} > {cap}).")
    # activation checkpointing
    if best.activation_checkpointing:
        off = [c for c in same if not c.activation_checkpointing]
        if off:
            o = off[0]
            out.append(f"Activation checkpointing on: without it {best.name} fits only as micro-batch {o.device_batch} "
                       f"({o.strategy}), {_slower(o, best)}.")
        else:
            need = _min_memory(best.spec, result, "fsdp", False)
            out.append(f"Activation checkpointing on: without it {best.name} does not fit (needs {fmt_bytes(need)} "
                       f"> {cap} even with fsdp at micro-batch {result.micro_batches[-1]}).")
    elif True in result.ac_options:
        out.append("Activation checkpointing off: it would recompute the forward (+1/3 compute per token) "
                   "and the model fits without it.")
    out.append(_why_micro_batch(result, best, sib))
    return out


def _ddp_twin(sib: list[Candidate], c: Candidate) -> Candidate | None:
    """ddp at c's micro-batch and checkpointing, if it fits."""
    return next((x for x in sib if x.strategy == "ddp" and x.device_batch == c.device_batch
                 and x.activation_checkpointing == c.activation_checkpointing), None)


def _optimizer_bytes(result: SearchResult, c: Candidate, strategy: str) -> int:
    s, hw = result.settings, result.hw
    cfg = StepConfig(spec=c.spec, device_batch_size=c.device_batch, grad_accum_steps=c.grad_accum, dp=hw.num_gpus,
                     precision=s.precision, optimizer=s.optimizer, strategy=strategy,  # type: ignore[arg-type]
                     activation_checkpointing=c.activation_checkpointing, loss_chunk_tokens=s.loss_chunk_tokens)
    return estimate(cfg).breakdown["optimizer_state"]


def zero1_sentence(g: int, state_ddp: int, state_zero1: int, cost: float, mem_ddp: int, mem_zero1: int) -> str:
    """Why zero1 is the default on several GPUs (search and fit share it)."""
    speed = (f"its broadcast of the updated parameters makes the step {_pct(cost)} slower than ddp's"
             if cost > 0 else f"its step is {_pct(-cost)} faster than ddp's (each GPU steps 1/{g} of the parameters)")
    return (f"Strategy zero1: it shards the optimizer state over the {g} GPUs ({fmt_bytes(state_zero1)} per GPU "
            f"instead of {fmt_bytes(state_ddp)}; peak {fmt_bytes(mem_zero1)} vs ddp's {fmt_bytes(mem_ddp)}), and "
            f"{speed}, within the {SETTINGS_TOL:.0%} the step-time model cannot resolve, so on several GPUs it is "
            "the default (--strategy ddp keeps a whole copy on every GPU).")


def _why_zero1(result: SearchResult, best: Candidate, ddp: Candidate) -> str:
    cost = best.step_seconds / ddp.step_seconds - 1
    return zero1_sentence(result.hw.num_gpus, _optimizer_bytes(result, best, "ddp"),
                          _optimizer_bytes(result, best, "zero1"), cost, ddp.mem_bytes, best.mem_bytes)


def _step_of(result: SearchResult, c: Candidate) -> Throughput:
    """The throughput model's terms for a candidate (the search keeps only their sum)."""
    s, hw = result.settings, result.hw
    cfg = StepConfig(spec=c.spec, device_batch_size=c.device_batch, grad_accum_steps=c.grad_accum, dp=hw.num_gpus,
                     precision=s.precision, optimizer=s.optimizer, strategy=c.strategy,  # type: ignore[arg-type]
                     activation_checkpointing=c.activation_checkpointing, loss_chunk_tokens=s.loss_chunk_tokens,
                     compile=_compiled(result))
    return estimate_throughput(cfg, hw, mfu=s.mfu)


def _pct(x: float) -> str:
    """A relative difference: one decimal, two below 0.1%."""
    return f"{x:.1%}" if abs(x) >= 0.001 else f"{x:.2%}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def _why_micro_batch(result: SearchResult, best: Candidate, sib: list[Candidate]) -> str:
    """The micro-batch sentence: the largest that fits, unless the step-time model shows a reason."""
    b, T, g = best.device_batch, best.spec.seq_len, result.hw.num_gpus
    alike = [c for c in sib if c.strategy == best.strategy and c.activation_checkpointing == best.activation_checkpointing]
    bmax = max(c.device_batch for c in alike)
    head = (f"Micro-batch {b} × {best.grad_accum} accumulation step{'s' if best.grad_accum > 1 else ''} × "
            f"{g} GPU{'s' if g > 1 else ''} × {T} = {result.settings.total_batch_tokens:,} tokens per step")
    chunk = result.settings.loss_chunk_tokens
    tp = _step_of(result, best)

    def trade(small: Candidate, ts: Throughput, large: Candidate, tl: Throughput) -> str:
        """What the smaller micro-batch saves (one loss chunk) against what its extra micro-steps cost."""
        n = small.grad_accum - large.grad_accum
        cost = (f"{n} extra micro-step{'s' if n > 1 else ''} cost{'s' if n == 1 else ''} "
                f"{_ms(ts.micro_step_seconds - tl.micro_step_seconds)} per step (gradient accumulation, launches)")
        saved = tl.loss_recompute_seconds - ts.loss_recompute_seconds
        if saved <= 0:
            return f"its {cost}"
        return (f"{small.device_batch * T:,} tokens fit in one loss chunk ({chunk:,}), which saves {_ms(saved)} of "
                f"head recompute per step, while its {cost}")

    if bmax > b:   # a smaller micro-batch than fits: the model shows a reason
        big = next(c for c in alike if c.device_batch == bmax)
        return (head + f", not the largest that fits ({bmax}): {trade(best, tp, big, _step_of(result, big))}; "
                f"{_pct(best.tokens_per_sec / big.tokens_per_sec - 1)} more tokens/s than micro-batch {bmax}, more "
                f"than the {SETTINGS_TOL:.0%} the step-time model resolves.")
    if b == result.micro_batches[0]:
        why = " (the whole per-GPU batch, no accumulation)"
    else:
        nxt = min(x for x in result.micro_batches if x > b)
        need = _memory_at(best.spec, result, best.strategy, best.activation_checkpointing, nxt)
        why = (f": the largest micro-batch that fits with {best.settings_label} (micro-batch {nxt} needs "
               f"{fmt_bytes(need)} > {fmt_bytes(result.capacity)})")
    smaller = sorted((c for c in alike if c.device_batch < b), key=lambda c: c.step_seconds)
    if not smaller:
        return head + why + "."
    alt = smaller[0]   # the fastest of the smaller micro-batches
    ta = _step_of(result, alt)
    r = best.tokens_per_sec / alt.tokens_per_sec - 1
    if r >= 0:
        return (head + why + f". Against micro-batch {alt.device_batch}, the fastest smaller one: "
                f"{trade(alt, ta, best, tp)}; {_pct(r)} fewer tokens/s there.")
    return (head + why + f". Micro-batch {alt.device_batch} would be {_pct(-r)} faster ({trade(alt, ta, best, tp)}), "
            f"within the {SETTINGS_TOL:.0%} the step-time model cannot resolve, so the largest micro-batch wins.")


def _memory_at(spec: ModelSpec, result: SearchResult, strategy: str, ac: bool, b: int) -> int:
    """Per-GPU bytes of `spec` at micro-batch `b` (for 'does not fit' sentences)."""
    hw, s = result.hw, result.settings
    cfg = StepConfig(spec=spec, device_batch_size=b,
                     grad_accum_steps=s.total_batch_tokens // (b * spec.seq_len * hw.num_gpus), dp=hw.num_gpus,
                     precision=s.precision, optimizer=s.optimizer, strategy=strategy,  # type: ignore[arg-type]
                     activation_checkpointing=ac, loss_chunk_tokens=s.loss_chunk_tokens, compile=_compiled(result))
    return memory_of(cfg, hw).total


# ---------------------------------------------------------------- CLI entry point


def runners_up_table(result: SearchResult, top: int, width: int | None = None) -> Any:
    """Rich table: the winner and the best run of each of the next `top` models, each with its own hours and cost.

    Columns are chosen to fit `width` (planner.tables); None shows them all."""
    from planner.tables import Col, fit_table  # noqa: PLC0415

    rows = result.per_model()[: top + 1]
    ds = result.settings.dataset_tokens is not None
    spend = "" if result.length.steps is not None else " at equal spend"
    cols = [Col("#", 0), Col("model", 0, "left"), Col("params", 1), Col("b×acc", 5), Col("strategy", 3, "left"),
            Col("GiB", 6), Col("tok/s", 4), Col("tokens", 0), Col("tok/p", 2), *([Col("epochs", 2)] * ds),
            Col("hours", 0), Col("cost", 0), Col("loss", 0)]
    cells = []
    for i, c in enumerate(rows):
        cells.append(["★" if i == 0 else str(i), c.name, fmt_count(c.n_params), f"{c.device_batch}×{c.grad_accum}",
                      c.settings_label, f"{c.mem_bytes / 2**30:.1f}", fmt_count(c.tokens_per_sec), fmt_count(c.tokens),
                      f"{c.tokens_per_param:.1f}", *([f"{c.epochs or 0:.1f}"] if ds else []), f"{c.hours:.1f}" if c.hours >= 0.1
                      else f"{c.hours:.2g}", f"${c.usd:,.0f}" if c.usd >= 10 else f"${c.usd:,.2f}", f"{c.loss:.3f}"])
    return fit_table(cols, cells, width, title=f"Best run of each model by '{result.objective}'{spend} "
                     f"(winner and {len(rows) - 1} runners-up)", styles=["bold green"] + [None] * (len(rows) - 1))


def settings_from(base: dict[str, Any]) -> Settings:
    return Settings(total_batch_tokens=base.get("total_batch_tokens", 524_288),
                    precision=base.get("precision", "bf16-autocast"), optimizer=base.get("optimizer", "adamw"),
                    loss_chunk_tokens=base.get("loss_chunk_tokens", DEFAULT_LOSS_CHUNK_TOKENS), headroom=base.get("headroom", DEFAULT_HEADROOM),
                    mfu=base.get("mfu"), dataset_tokens=base.get("dataset_tokens"),
                    max_epochs=base.get("max_epochs") or FRESH_EPOCHS, compile=base.get("compile"))


def length_from(base: dict[str, Any]) -> Length:
    """The run's length from PlanRequest fields (exactly one of budget_usd, hours, steps)."""
    return Length(budget_usd=base.get("budget_usd"), hours=base.get("hours"), steps=base.get("steps"))


def search_cli(base: dict[str, Any], *, objective: str = "loss", top: int = 5, seq_len: int | None = None,
               vocab_size: int | None = None, style: str | None = None, plan_path: str = "plan.json",
               console: Any = None, wide: bool = False) -> Plan:
    """`nanoplan estimate` with no model: search, print runners-up and reasons, return the plan."""
    if top < 0:
        raise PlanError("--top", f"must be >= 0, got {top}")
    hw = parse_gpu_spec(base["gpu"], profile=base["profile"], provider=base.get("provider"), price=base.get("price"))
    models = depth_ladder(style or "nanochat", seq_len=seq_len or 2048, vocab_size=vocab_size)
    result = search(models, hw, length_from(base), settings_from(base), objective=objective,
                    device_batch=base.get("device_batch_size"))
    if result.best is None:
        raise nothing_fits(result)
    plan = plan_for_best(result, {k: v for k, v in base.items() if k != "model"}, plan_path=plan_path)
    if console is not None:
        from rich.panel import Panel  # noqa: PLC0415

        from planner.tables import print_table  # noqa: PLC0415

        print_table(console, runners_up_table(result, top, None if wide else console.width))
        console.print(Panel("\n".join(f"• {x}" for x in explain(result)), title=f"Why {plan.model.name}",
                            title_align="left"))
    return plan
