"""Plan search: the best run for a budget on one hardware configuration (pure Python).

The search enumerates model size (a depth ladder of one style, or a given list such as
presets) × micro-batch (every divisor of the per-GPU batch) × strategy (ddp, zero1, zero2,
fsdp) × activation checkpointing (off, on). It keeps the candidates that fit the memory
model with headroom and ranks them by an objective:

- loss: lowest predicted loss L(N, D') (planner.scaling: Chinchilla fit, Muennighoff D');
- max-model: most parameters, then most tokens;
- throughput: most tokens (then shortest step);
- chinchilla: the model whose fastest setting lands closest to 20 tokens/param (in ratio),
  then that fastest setting.

Ties on the objective go to the simpler settings: ddp before zero1/zero2/fsdp, no
checkpointing before checkpointing, then the bigger micro-batch.

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
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from planner.build import batch_choices, build_plan, memory_of
from planner.counts import flops_per_token, matmul_params, matrix_params, n_params
from planner.errors import PlanError
from planner.memory import STRATEGIES, Optimizer, Precision, StepConfig, _bytes, allocated_peak, layer_activation_bytes
from planner.plan import Plan, PlanRequest
from planner.profiles import Hardware, parse_gpu_spec
from planner.scaling import (
    ALPHA,
    BETA,
    R_STAR_D,
    A,
    B,
    E,
    chinchilla_distance,
    effective_params,
    effective_tokens,
)
from planner.spec import ModelSpec, style_spec
from planner.throughput import comm_model, exposed_seconds, link_bytes_per_s
from planner.units import fmt_bytes, fmt_count

OBJECTIVES = ("loss", "max-model", "throughput", "chinchilla")
STRATEGY_RANK = {s: i for i, s in enumerate(STRATEGIES)}
DEFAULT_DEPTHS = tuple(range(2, 65, 2))
LOSS_TOL = 0.005     # relative: predicted losses this close are a tie; the fit's own uncertainty is larger (Besiroglu et al. 2024)
FRESH_EPOCHS = 4.0
EPOCH_LADDER = (1, 2, 3, 4)   # with a dataset, runs may also stop after these epochs   # Muennighoff et al. 2023: up to ~4 epochs are about as good as fresh data
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
    loss_chunk_tokens: int = 4096
    headroom: float = 0.05
    mfu: float | None = None
    dataset_tokens: int | None = None
    max_epochs: float | None = FRESH_EPOCHS   # with a dataset: never plan more epochs than this


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


def tie_break(c: Candidate) -> tuple:
    """Simpler first: ddp before sharding, no checkpointing first, bigger micro-batch first."""
    return (STRATEGY_RANK[c.strategy], c.activation_checkpointing, -c.device_batch)


def objective_key(objective: str, c: Candidate) -> tuple:
    if objective == "loss":
        return (c.loss,)
    if objective == "max-model":
        return (-c.n_params, -c.tokens, c.step_seconds)
    if objective == "throughput":
        return (-c.tokens, c.step_seconds)
    if objective == "chinchilla":
        return (chinchilla_distance(c.tokens_per_param), -c.tokens)
    raise PlanError("--objective", f"unknown objective {objective!r}", f"choose one of {', '.join(OBJECTIVES)}")


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
    head_flops: float    # chunked-loss recompute per token (2·V·d)


def _model_parts(spec: ModelSpec, s: Settings, hw: Hardware) -> _ModelParts:
    _, a, r = _bytes(s.precision)
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
        head_flops=2.0 * spec.vocab_size * spec.d_model,
    )


def search(models: Sequence[ModelSpec], hw: Hardware, length: Length, settings: Settings = Settings(), *,
           objective: str = "loss", strategies: Sequence[str] = STRATEGIES,
           ac_options: Sequence[bool] = (False, True), device_batch: int | None = None) -> SearchResult:
    """Evaluate every candidate on `hw`; return the fitting ones ranked by `objective`."""
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
    w, a, _ = _bytes(settings.precision)
    peak = prof.peak_flops("fp32" if settings.precision == "fp32" else "bf16")
    bw = link_bytes_per_s(hw)
    chunk = settings.loss_chunk_tokens
    ds = settings.dataset_tokens
    cap_steps = (max(1, math.floor(settings.max_epochs * ds / tb)) if ds and settings.max_epochs else None)
    epoch_steps = (sorted({max(1, math.floor(k * ds / tb)) for k in EPOCH_LADDER if cap_steps is None or k * ds / tb <= cap_steps})
                   if ds and objective == "loss" else [])

    obj_code = {"loss": 0, "max-model": 1, "throughput": 2, "chinchilla": 2}[objective]
    fixed_steps = length.steps
    run_hours = (length.hours if length.hours is not None else
                 length.budget_usd / usd_per_hour if length.budget_usd is not None else 0.0)
    ranked: list[tuple[tuple, Candidate]] = []
    evaluated = 0
    for spec in models:
        mp = _model_parts(spec, settings, hw)
        P = mp.P
        e_a = E + A / effective_params(P, ds)**ALPHA   # the model term of L(N', D') (scaling.predicted_loss)
        # per micro-batch: activation and loss bytes (strategy-independent)
        per_b = []
        for b in choices:
            tok = b * T
            hw_flops_extra = mp.head_flops if (chunk and chunk < tok) else 0.0
            per_b.append((b, tb // (b * T * g), hw_flops_extra))
        for strat in strategies:
            cm = comm_model(StepConfig(spec=spec, device_batch_size=1, dp=g, precision=settings.precision,
                                       strategy=strat), g, gpu=is_gpu)  # type: ignore[arg-type]
            srank = STRATEGY_RANK[strat]
            for ac in ac_options:
                f_hw = (mp.f_tok + mp.f_tok / 3.0) if ac else float(mp.f_tok)
                for b, accum, extra in per_b:
                    evaluated += 1
                    alloc = allocated_peak(StepConfig(  # planner.memory's cached fast path (= estimate)
                        spec=spec, device_batch_size=b, grad_accum_steps=accum, dp=g, precision=settings.precision,
                        optimizer=settings.optimizer, strategy=strat, activation_checkpointing=ac,  # type: ignore[arg-type]
                        loss_chunk_tokens=chunk))
                    total = alloc + fixed_over + (int(alloc * frag) if frag else 0)
                    if total > capacity:
                        continue
                    compute = tb * (f_hw + extra) / (g * mp.mfu * peak)
                    step_s = compute + exposed_seconds(cm, bw, compute, accum) if g > 1 else compute
                    if fixed_steps is None:
                        steps = max(1, math.floor(run_hours * 3600 / step_s))
                        hours = run_hours
                    else:
                        steps = fixed_steps
                        hours = steps * step_s / 3600
                    if cap_steps is not None and steps > cap_steps:
                        steps = cap_steps
                        hours = steps * step_s / 3600
                    # with a dataset, shorter runs that stop at whole numbers of epochs are candidates too
                    lengths = [steps] + [k for k in epoch_steps if k < steps] if epoch_steps else [steps]
                    evaluated += len(lengths) - 1
                    for steps in lengths:
                        hours = steps * step_s / 3600 if steps != lengths[0] else hours
                        tokens = steps * tb
                        loss = (e_a + B / tokens**BETA) if ds is None else e_a + B / effective_tokens(tokens, ds)**BETA
                        c = Candidate(spec, P, b, accum, strat, ac, total, step_s, tb / step_s, steps, tokens, hours,
                                      hours * usd_per_hour, loss, tokens / ds if ds else None)
                        if obj_code == 0:
                            ranked.append(((loss, srank, ac, -b), c))
                        elif obj_code == 1:
                            ranked.append(((-P, -tokens, step_s, srank, ac, -b), c))
                        else:
                            ranked.append(((-tokens, step_s, srank, ac, -b), c))
    if objective == "chinchilla":
        # Rank models by how close their fastest setting gets to 20 tokens/param, then the fastest setting:
        # slowing a run down (e.g. needless checkpointing) to hit the ratio would waste the budget.
        most: dict[ModelSpec, int] = {}
        for _, c in ranked:
            most[c.spec] = max(most.get(c.spec, 0), c.tokens)
        ranked = [((chinchilla_distance(most[c.spec] / c.n_params), *key), c) for key, c in ranked]
    if objective == "loss" and ranked:
        # Losses within LOSS_TOL of the best are a tie: take the cheapest of them (on a small dataset
        # bigger models stop paying off, and the fit cannot tell such runs apart), then the lowest loss.
        best_loss = min(k[0] for k, _ in ranked)
        ranked = [((k[0] > best_loss * (1 + LOSS_TOL), round(c.usd, 2) if k[0] <= best_loss * (1 + LOSS_TOL) else 0.0,
                    *k), c) for k, c in ranked]
    ranked.sort(key=itemgetter(0))
    return SearchResult(hw=hw, objective=objective, settings=settings, length=length, models=tuple(models),
                        micro_batches=tuple(choices), strategies=tuple(strategies), ac_options=tuple(ac_options),
                        ranked=[c for _, c in ranked], evaluated=evaluated, capacity=capacity,
                        seconds=time.perf_counter() - t0)


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
        if plan.memory.fits:
            return plan
    raise nothing_fits(result)


def nothing_fits(result: SearchResult) -> PlanError:
    hw = result.hw
    small = min(result.models, key=n_params)
    cfg = StepConfig(spec=small, device_batch_size=result.micro_batches[-1],
                     grad_accum_steps=result.settings.total_batch_tokens // (result.micro_batches[-1] * small.seq_len * hw.num_gpus),
                     dp=hw.num_gpus, precision=result.settings.precision, optimizer=result.settings.optimizer,
                     strategy="fsdp", activation_checkpointing=True, loss_chunk_tokens=result.settings.loss_chunk_tokens)
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
                     activation_checkpointing=ac, loss_chunk_tokens=s.loss_chunk_tokens)
    return memory_of(cfg, hw).total


def _tpp(c: Candidate) -> str:
    """Tokens/param for sentences: 3 significant figures below 10, 1 decimal below 1000, then commas."""
    x = c.tokens_per_param
    return f"{x:.3g}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def _slower(other: Candidate, best: Candidate) -> str:
    r = other.tokens_per_sec / best.tokens_per_sec - 1
    return f"{-r:.1%} slower" if r <= 0 else f"{r:.1%} faster but worse by the objective"


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
    when = f"at {_h(best.hours)}" if result.length.steps is None else f"in {best.steps:,} steps"
    obj = result.objective
    if obj == "loss":
        verb = "is the cheapest run whose predicted loss ties the best" if best.loss > min(c.loss for c in result.ranked) \
            else "has the lowest predicted loss"
        out.append(f"{_loss_line(best)} {verb}, {best.loss:.3f}: {fmt_count(best.tokens)} tokens "
                   f"({_tpp(best)} tokens/param{_data_clause(best, ds)}) {when} for ${best.usd:,.0f}"
                   + (f" (ties: losses within {LOSS_TOL:.1%})." if ds else "."))
    elif obj == "max-model":
        out.append(f"{_loss_line(best)} is the biggest model that fits; it sees {fmt_count(best.tokens)} tokens "
                   f"({_tpp(best)} tokens/param{_data_clause(best, ds)}) {when}.")
    elif obj == "throughput":
        out.append(f"{_loss_line(best)} trains on the most tokens: {fmt_count(best.tokens)} at "
                   f"{best.tokens_per_sec:,.0f} tokens/s {when} ({_tpp(best)} tokens/param).")
    else:
        out.append(f"{_loss_line(best)} is closest to 20 tokens/param: {_tpp(best)} "
                   f"({fmt_count(best.tokens)} tokens {when}).")

    idx = next(i for i, c in enumerate(by_n) if c.spec == best.spec)
    bigger = by_n[idx + 1] if idx + 1 < len(by_n) else None
    smaller = by_n[idx - 1] if idx > 0 else None
    bwhen = ""
    if bigger is not None:
        bwhen = f"at {_h(bigger.hours)}" if result.length.steps is None else f"in {bigger.steps:,} steps"
    if obj == "chinchilla":
        for other in (x for x in (bigger, smaller) if x is not None):
            out.append(f"{best.name} beats {other.name}: {other.name} would see {_tpp(other)} "
                       f"tokens/param, further from 20.")
    if bigger is not None and obj == "loss" and bigger.loss < best.loss:
        out.append(f"{best.name} beats {bigger.name}: {bigger.name}'s predicted loss {bigger.loss:.3f} is within "
                   f"{LOSS_TOL:.1%} of {best.loss:.3f}, a tie for this fit, and it would cost ${bigger.usd:,.0f} "
                   f"instead of ${best.usd:,.0f}.")
    elif bigger is not None and obj in ("loss", "throughput"):
        out.append(f"{best.name} beats {bigger.name}: {bwhen}, {bigger.name} would see only "
                   f"{_tpp(bigger)} tokens/param{_data_clause(bigger, ds)} (predicted loss {bigger.loss:.3f}).")
    if smaller is not None and obj == "loss":
        out.append(f"{best.name} beats {smaller.name}: {smaller.name} would see {_tpp(smaller)} "
                   f"tokens/param{_data_clause(smaller, ds)}, but with {fmt_count(smaller.n_params)} params its "
                   f"predicted loss is {smaller.loss:.3f}.")
    biggest = by_n[-1]
    if biggest.spec != best.spec and (bigger is None or biggest.spec != bigger.spec):
        out.append(f"The biggest model that fits, {biggest.name} ({fmt_count(biggest.n_params)} params, "
                   f"{biggest.settings_label}), would see only {_tpp(biggest)} tokens/param "
                   f"(predicted loss {biggest.loss:.3f}).")
    if biggest.spec == best.spec:
        out.append(_why_not_bigger(result, best))
    if obj != "loss":
        lbest = min(result.ranked, key=lambda c: rank_key("loss", c))
        if lbest.spec != best.spec:
            out.append(f"For the lowest predicted loss, --objective loss picks {lbest.name} ({lbest.loss:.3f} vs "
                       f"{best.loss:.3f}).")
    if ds:
        d_eff = effective_tokens(best.tokens, ds)
        if best.tokens > ds:
            out.append(f"With {fmt_count(ds)} unique tokens, {best.tokens / ds:.1f} epochs of {best.name} are worth "
                       f"{fmt_count(d_eff)} fresh tokens ({d_eff / best.tokens:.0%} of {fmt_count(best.tokens)}; "
                       f"Muennighoff et al. 2023, R* = {R_STAR_D}).")
            cap = s.max_epochs
            if cap is not None and best.tokens >= (cap * ds) - result.settings.total_batch_tokens:
                full = result.length.budget_usd if result.length.budget_usd is not None else None
                of = f" of the ${full:,.0f} budget" if full else ""
                out.append(f"It stops at {cap:g} epochs (--max-epochs; Muennighoff et al. 2023: up to ~4 epochs are "
                           f"nearly as good as fresh data, beyond that repeats add little): {_h(best.hours)}, "
                           f"${best.usd:,.0f}{of}. Spending more on this dataset would mostly repeat it.")
        else:
            out.append(f"The run sees {best.tokens / ds:.2f} of one epoch of the {fmt_count(ds)}-token dataset.")
    out.extend(_why_settings(result, best))
    return [x for x in out if x]


def _why_not_bigger(result: SearchResult, best: Candidate) -> str:
    specs = sorted(result.models, key=n_params)
    bigger = [m for m in specs if n_params(m) > best.n_params]
    if not bigger:
        return f"{best.name} is the largest model in the search range."
    nxt = bigger[0]
    need = _min_memory(nxt, result, "fsdp", True)
    return (f"{nxt.name} does not fit: even at micro-batch {result.micro_batches[-1]} with fsdp + checkpointing it "
            f"needs {fmt_bytes(need)} > {fmt_bytes(result.capacity)} per GPU.")


def _why_settings(result: SearchResult, best: Candidate) -> list[str]:
    same = [c for c in result.ranked if c.spec == best.spec]
    out = []
    cap = fmt_bytes(result.capacity)
    # strategy
    if best.strategy == "ddp":
        if result.hw.num_gpus > 1:
            out.append("Strategy ddp: the model fits unsharded, and zero1/zero2/fsdp are no faster here "
                       "(ties go to the simpler setting).")
    else:
        ddp = [c for c in same if c.strategy == "ddp"]
        if ddp:
            d = ddp[0]
            out.append(f"Strategy {best.strategy}: ddp fits only as micro-batch {d.device_batch}"
                       f"{' + AC' if d.activation_checkpointing else ''}, "
                       f"{_slower(d, best)}.")
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
    # micro-batch
    b, T = best.device_batch, best.spec.seq_len
    alike = [c for c in same if c.strategy == best.strategy and c.activation_checkpointing == best.activation_checkpointing]
    bmax = max(c.device_batch for c in alike)
    head = (f"Micro-batch {b} × {best.grad_accum} accumulation step{'s' if best.grad_accum > 1 else ''} × "
            f"{result.hw.num_gpus} GPU{'s' if result.hw.num_gpus > 1 else ''} × {T} = "
            f"{result.settings.total_batch_tokens:,} tokens per step")
    if b == result.micro_batches[0]:
        out.append(head + " (the whole per-GPU batch, no accumulation).")
    elif bmax > b:
        big = next(c for c in alike if c.device_batch == bmax)
        chunk = result.settings.loss_chunk_tokens
        why = (f"{b * T:,} tokens fit in one loss chunk ({chunk:,}), so the head is not recomputed"
               if chunk and b * T <= chunk < bmax * T else "shorter step under the throughput model")
        out.append(head + f": {why}; {best.tokens_per_sec / big.tokens_per_sec - 1:.1%} more tokens/s than "
                   f"micro-batch {bmax}.")
    else:
        nxt = [x for x in result.micro_batches if x > b]
        if nxt:
            out.append(head + f" (micro-batch {min(nxt)} does not fit with {best.settings_label}).")
        else:
            out.append(head + ".")
    return out


# ---------------------------------------------------------------- CLI entry point


def runners_up_table(result: SearchResult, top: int) -> Any:
    """Rich table: the winner and the best choice of each of the next `top` models."""
    from rich.table import Table  # noqa: PLC0415

    rows = result.per_model()[: top + 1]
    varies = result.length.steps is not None          # budget/hours: every row has the same hours and cost
    ds = result.settings.dataset_tokens is not None
    first = rows[0]
    when = "" if varies else f", each {_h(first.hours)} for ${first.usd:,.0f}"
    from rich import box  # noqa: PLC0415

    t = Table(title=f"Best of each model by '{result.objective}' (winner and {len(rows) - 1} runners-up{when})",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    cols = ["#", "model", "params", "b×acc", "strategy", "GiB", "tok/s", "tokens", "tok/p"]
    cols += ["epochs"] * ds + ["hours", "cost"] * varies + ["loss"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("model", "strategy") else "right", no_wrap=True,
                     min_width=8 if col == "strategy" else None)
    for i, c in enumerate(rows):
        cells = ["★" if i == 0 else str(i), c.name, fmt_count(c.n_params), f"{c.device_batch}×{c.grad_accum}",
                 c.settings_label, f"{c.mem_bytes / 2**30:.1f}", fmt_count(c.tokens_per_sec), fmt_count(c.tokens),
                 f"{c.tokens_per_param:.1f}"]
        if ds:
            cells.append(f"{c.epochs:.1f}")
        if varies:
            cells += [f"{c.hours:.1f}", f"${c.usd:,.0f}"]
        cells.append(f"{c.loss:.3f}")
        t.add_row(*cells, style="bold green" if i == 0 else None)
    return t


def settings_from(base: dict[str, Any]) -> Settings:
    return Settings(total_batch_tokens=base.get("total_batch_tokens", 524_288),
                    precision=base.get("precision", "bf16-autocast"), optimizer=base.get("optimizer", "adamw"),
                    loss_chunk_tokens=base.get("loss_chunk_tokens", 4096), headroom=base.get("headroom", 0.05),
                    mfu=base.get("mfu"), dataset_tokens=base.get("dataset_tokens"),
                    max_epochs=base.get("max_epochs") or FRESH_EPOCHS)


def length_from(base: dict[str, Any]) -> Length:
    """The run's length from PlanRequest fields (exactly one of budget_usd, hours, steps)."""
    return Length(budget_usd=base.get("budget_usd"), hours=base.get("hours"), steps=base.get("steps"))


def search_cli(base: dict[str, Any], *, objective: str = "loss", top: int = 5, seq_len: int | None = None,
               vocab_size: int | None = None, style: str | None = None, plan_path: str = "plan.json",
               console: Any = None) -> Plan:
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

        console.print(runners_up_table(result, top))
        console.print(Panel("\n".join(f"• {x}" for x in explain(result)), title=f"Why {plan.model.name}",
                            title_align="left"))
    return plan
