"""Ranking the candidates of a plan search: objectives, run lengths and ties (pure Python).

The fitting settings (planner.candidates) get their run length and are ranked by an objective:

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
"""

from __future__ import annotations

import math
from dataclasses import replace
from operator import itemgetter

from planner.candidates import Candidate, SearchResult, Settings
from planner.errors import PlanError
from planner.memory_terms import STRATEGIES
from planner.profiles import Hardware
from planner.scaling import chinchilla_distance, data_term, model_term
from planner.spec import ModelSpec
from planner.startup import fixed_seconds, paid_seconds, steps_within

OBJECTIVES = ("loss", "value", "max-model", "throughput", "chinchilla")
STRATEGY_RANK = {s: i for i, s in enumerate(STRATEGIES)}
# several GPUs: zero1 shards the optimizer state at a modelled cost, so among ties it goes first
MULTI_GPU_RANK = {s: i for i, s in enumerate(("zero1", "ddp", "zero2", "fsdp"))}
SETTINGS_TOL = 0.01  # relative step time: assumption; the throughput model's assumed constants (LAUNCH_SECONDS,
                     # kernel counts, OVERLAP) move step times by more than this (docs/throughput.md)
# relative: --objective value takes the cheapest run within this of the lowest predicted loss, and the loss
# objective names such a run when it is much cheaper; the fit's own uncertainty is larger (Besiroglu et al. 2024)
VALUE_TOL = 0.005


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


def length_key(c: Candidate, run_hours: float | None, fixed_s: float = 0.0) -> tuple:
    """Candidates of one model with the same key ran for the same length: the spend `run_hours` (the
    budget's or --hours' full time, or a shorter spend whose plan pins the whole steps that fit in it,
    so each setting has its own step count), or a number of steps (--steps, an epoch cap or an epoch stop).
    fixed_s: the launch's start-up and compile (planner/startup.py), paid out of every spend."""
    if run_hours is not None and (c.hours == run_hours or c.steps == _steps_at(run_hours, c.step_seconds, fixed_s)):
        return ("hours", run_hours)
    return ("steps", c.steps)


def prefer_simpler(ranked: list[Candidate], tol: float, run_hours: float | None,
                   shard_first: bool = False, fixed_s: float = 0.0) -> list[Candidate]:
    """Move each model's simplest near-fastest setting to the place of its best one.

    For the first (best) candidate f of each model, its siblings (same model, same `length_key`)
    whose step time is within (1 + tol) of f's tie with it; the simplest of them by `tie_break`
    takes f's place. Only the order changes: every candidate keeps its own numbers.
    """
    first: dict[int, tuple[int, tuple, float]] = {}   # id(spec) -> (its best's index, length key, step limit)
    for i, c in enumerate(ranked):
        if id(c.spec) not in first:
            first[id(c.spec)] = (i, length_key(c, run_hours, fixed_s), c.step_seconds * (1.0 + tol))
    pick: dict[int, tuple[tuple, int]] = {}          # id(spec) -> (tie_break, index) of the simplest tied sibling
    for j, c in enumerate(ranked):
        i, lk, limit = first[id(c.spec)]
        if j != i and c.step_seconds <= limit and length_key(c, run_hours, fixed_s) == lk:
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


def choose(fitting: list[tuple], objective: str, steps: int | None, run_hours: float, tb: int, ds: int | None,
           cap_steps: int | None, usd_per_hour: float, fixed_s: float = 0.0) -> tuple[float, list[Candidate], int | None]:
    """(spend in hours, ranked candidates, size cap) for an objective; see docs/planning.md.

    loss and value with a dataset: the model may not be bigger than the one the same objective picks with
    unlimited data. Where a run would repeat its data but its model is still below the data's compute-optimal
    size, only the repeats are discounted, which favours a bigger model on fewer tokens; the cap keeps less
    data from ever buying a bigger model."""
    if steps is not None or objective not in ("loss", "value") or not fitting:
        return run_hours, ranked_candidates(fitting, objective, steps, run_hours, tb, ds, cap_steps, usd_per_hour,
                                            fixed_s=fixed_s), None
    size_cap = None
    frontier = fitting
    if ds is not None:
        free = ranked_candidates(fitting, objective, None, _spend_hours(fitting, run_hours, tb, None, None, objective,
                                                                        fixed_s), tb, None, None, usd_per_hour, fixed_s=fixed_s)
        size_cap = free[0].n_params
        frontier = [f for f in fitting if f[1] <= size_cap]
    spend = _spend_hours(frontier, run_hours, tb, ds, cap_steps, objective, fixed_s)
    short = spend < run_hours * (1 - 1e-12)   # a shorter run than the budget: its plan pins the steps
    return spend, ranked_candidates(fitting, objective, None, spend, tb, ds, cap_steps, usd_per_hour, size_cap,
                                    pinned=short, fixed_s=fixed_s), size_cap


def epoch_cap_steps(s: Settings) -> int | None:
    """Steps at --max-epochs of the dataset (None without a dataset or a cap)."""
    ds, tb = s.dataset_tokens, s.total_batch_tokens
    return max(1, math.floor(s.max_epochs * ds / tb)) if ds and s.max_epochs else None


def with_objective(result: SearchResult, objective: str, hours: float | None = None) -> SearchResult:
    """The same fitting settings ranked by another objective (or at a given spend); no new memory work."""
    fitting = [(c.spec, c.n_params, c.device_batch, c.grad_accum, c.strategy, c.activation_checkpointing,
                c.mem_bytes, c.step_seconds) for c in result.ranked]
    s, steps = result.settings, result.length.steps
    cap = epoch_cap_steps(s)
    usd_h = result.hw.num_gpus * result.hw.usd_per_gpu_hour
    f = launch_fixed_s(result)
    if hours is not None:
        ranked = ranked_candidates(fitting, objective, steps, hours, s.total_batch_tokens, s.dataset_tokens, cap, usd_h,
                                   fixed_s=f)
        ranked = prefer_simpler(ranked, SETTINGS_TOL, hours if steps is None else None, zero1_first(result.hw), f)
        return replace(result, objective=objective, ranked=ranked, spend_hours=hours, size_cap=None)
    spend, ranked, size_cap = choose(fitting, objective, steps, result.run_hours, s.total_batch_tokens,
                                     s.dataset_tokens, cap, usd_h, f)
    ranked = prefer_simpler(ranked, SETTINGS_TOL, spend if steps is None else None, zero1_first(result.hw), f)
    return replace(result, objective=objective, ranked=ranked, spend_hours=spend, size_cap=size_cap)


def launch_fixed_s(result: SearchResult) -> float:
    """The launch's start-up and compile seconds of every run of a search (planner/startup.py)."""
    return fixed_seconds(result.hw.profile.kind, result.hw.nodes, result.compiled, result.settings.startup_seconds)


def _steps_at(hours: float, step_s: float, fixed_s: float) -> int:
    """Whole steps that train in `hours` of paid time after the launch's start-up (at least one)."""
    return max(1, steps_within(hours * 3600, step_s, fixed_s))


def _paid_h(steps: int, step_s: float, fixed_s: float) -> float:
    return paid_seconds(steps, step_s, fixed_s) / 3600


def _fastest(fitting: list[tuple]) -> list[tuple[int, float]]:
    """(params, fastest step seconds) of each model that fits."""
    best: dict[int, tuple[int, float]] = {}      # by id(spec): see ranked_candidates
    for spec, P, *_, step_s in fitting:
        k = id(spec)
        if k not in best or step_s < best[k][1]:
            best[k] = (P, step_s)
    return list(best.values())


def _spend_hours(fitting: list[tuple], run_hours: float, tb: int, ds: int | None, cap_steps: int | None,
                 objective: str, fixed_s: float = 0.0) -> float:
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
            steps = _steps_at(hours, s, fixed_s)
            key = (m_term + data_term(steps * tb, ds), P, steps)
            if out is None or key < out:
                out = key
        return out  # type: ignore[return-value]

    def within_cap(hours: float) -> bool:
        return cap_steps is None or best(hours)[2] <= cap_steps

    hours = run_hours
    if not within_cap(hours):
        # below this spend no model reaches the cap; search down a geometric grid, then bisect the edge
        floor_h = min(_paid_h(cap_steps, s, fixed_s) for _, _, s in models)   # type: ignore[arg-type]
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
        lo, hi = min(_paid_h(1, s, fixed_s) for *_, s in models), hours   # one step of the fastest model .. the loss spend
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


def ranked_candidates(fitting: list[tuple], objective: str, fixed_steps: int | None, hours: float, tb: int,
                      ds: int | None, cap_steps: int | None, usd_per_hour: float, size_cap: int | None = None,
                      pinned: bool = False, fixed_s: float = 0.0) -> list[Candidate]:
    """Give every fitting setting its length (fixed steps, or `hours`, capped at --max-epochs) and rank them.

    pinned: the spend is shorter than the budget, so the plan pins the steps (plan_for_best) and each run
    lasts exactly its whole steps."""
    m_terms: dict[int, float] = {}    # by id: a pydantic model hashes all its fields on every lookup
    keyed: list[tuple[tuple, Candidate]] = []
    for spec, P, b, accum, strat, ac, total, step_s in fitting:
        if (m_term := m_terms.get(id(spec))) is None:
            m_term = m_terms[id(spec)] = model_term(P, ds)
        if fixed_steps is None:
            steps = _steps_at(hours, step_s, fixed_s)
            h = _paid_h(steps, step_s, fixed_s) if pinned else hours
        else:
            steps, h = fixed_steps, _paid_h(fixed_steps, step_s, fixed_s)
        if cap_steps is not None and steps > cap_steps:
            steps, h = cap_steps, _paid_h(cap_steps, step_s, fixed_s)
        tokens = steps * tb
        loss = m_term + data_term(tokens, ds)
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

