"""Why the search chose its winner, in sentences with numbers, and the runners-up table (pure Python).

`explain` compares the winner with the next bigger and smaller models, the biggest that fits and
the other objectives; `why_settings` says why its strategy, checkpointing and micro-batch among the
model's fitting settings; `nothing_fits` says why no model fits. planner.fit shares the sentences.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.build import memory_of
from planner.candidates import Candidate, SearchResult
from planner.counts import n_params
from planner.errors import PlanError
from planner.memory import estimate
from planner.memory_terms import StepConfig
from planner.ranking import (
    SETTINGS_TOL,
    VALUE_TOL,
    launch_fixed_s,
    length_key,
    rank_key,
    with_objective,
    zero1_first,
)
from planner.scaling import R_STAR_D, R_STAR_N, data_optimal_params, effective_tokens
from planner.spec import ModelSpec
from planner.throughput import Throughput, estimate_throughput
from planner.units import fmt_bytes, fmt_count

# vocabularies near the loss fit's: Muennighoff et al. 2023 fitted on C4 with the GPT-2 tokenizer (50,257);
# 32k (Llama 2's) .. 65,536 (nanochat's) are taken as close enough to rank runs
FIT_VOCAB = (32_000, 65_536)
LOSS_FIT = "Muennighoff et al. 2023 fit"   # planner/scaling.py: the law the loss column comes from
MUCH_CHEAPER = 0.8   # "much less": at most 80% of the winner's cost


def runners_up_table(result: SearchResult, top: int, width: int | None = None) -> Any:
    """Rich table: the winner and the best run of each of the next `top` models, each with its own hours and cost.

    Columns are chosen to fit `width` (planner.tables); None shows them all."""
    from planner.tables import Col, fit_table  # noqa: PLC0415

    rows = result.per_model()[: top + 1]
    ds = result.settings.dataset_tokens is not None
    spend = "" if result.length.steps is not None else " at equal spend"
    cols = [Col("#", 0), Col("model", 0, "left"), Col("params", 1), Col("b×acc", 5), Col("strategy", 3, "left"),
            Col("GiB", 6), Col("tok/s", 4), Col("tokens", 0), Col("tok/p", 2), *([Col("epochs", 2)] * ds),
            Col("hours", 0), Col("cost", 0), Col(loss_header(result), 0)]
    cells = []
    for i, c in enumerate(rows):
        cells.append(["★" if i == 0 else str(i), c.name, fmt_count(c.n_params), f"{c.device_batch}×{c.grad_accum}",
                      c.settings_label, f"{c.mem_bytes / 2**30:.1f}", fmt_count(c.tokens_per_sec), fmt_count(c.tokens),
                      f"{c.tokens_per_param:.1f}", *([f"{c.epochs or 0:.1f}"] if ds else []), f"{c.hours:.1f}" if c.hours >= 0.1
                      else f"{c.hours:.2g}", f"${c.usd:,.0f}" if c.usd >= 10 else f"${c.usd:,.2f}", f"{c.loss:.4f}"])
    return fit_table(cols, cells, width, title=f"Best run of each model by '{result.objective}'{spend} "
                     f"(winner and {len(rows) - 1} runners-up)", styles=["bold green"] + [None] * (len(rows) - 1),
                     caption=" ".join(x for x in (loss_caption(result), _band_caption(result)) if x))


def _band_caption(result: SearchResult) -> str:
    """How sure the speed figures are (planner/uncertainty.py), one line."""
    from planner.uncertainty import band_note  # noqa: PLC0415

    return band_note(result.hw, trainer=None, compiled=result.compiled, by_steps=result.length.steps is not None,
                     mfu=result.settings.mfu)


def _vocab(result: SearchResult) -> int:
    return result.models[0].vocab_size if result.models else FIT_VOCAB[1]


def loss_header(result: SearchResult) -> str:
    """'loss', or 'loss*' where the vocabulary is far from the one the loss fit was made with (GPT-2's)."""
    return "loss" if FIT_VOCAB[0] <= _vocab(result) <= FIT_VOCAB[1] else "loss*"


def loss_caption(result: SearchResult) -> str | None:
    """The footnote of 'loss*': the fitted loss only ranks runs at this vocabulary."""
    if loss_header(result) == "loss":
        return None
    return (f"* {LOSS_FIT} (C4, GPT-2 tokenizer, vocab 50,257): ranks runs, not a loss to expect at vocab "
            f"{_vocab(result):,}")


def nothing_fits(result: SearchResult) -> PlanError:
    """The error when nothing fits: the smallest model at the smallest micro-batch with fsdp and
    checkpointing still needs more than the capacity."""
    hw = result.hw
    small = min(result.models, key=n_params)
    cfg = StepConfig(spec=small, device_batch_size=result.micro_batches[-1],
                     grad_accum_steps=result.settings.total_batch_tokens // (result.micro_batches[-1] * small.seq_len * hw.num_gpus),
                     dp=hw.num_gpus, precision=result.settings.precision, optimizer=result.settings.optimizer,
                     strategy="fsdp", activation_checkpointing=True, loss_chunk_tokens=result.settings.loss_chunk_tokens,
                     compile=result.compiled)
    need = memory_of(cfg, hw).total
    return PlanError("--gpu", f"no searched model fits on {hw.spec}: even {small.name} at micro-batch "
                     f"{cfg.device_batch_size} with fsdp + checkpointing needs {fmt_bytes(need)} > "
                     f"{fmt_bytes(result.capacity)} per GPU", "use more or bigger GPUs, a shorter --seq-len or a smaller --vocab-size")


def _h(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def min_memory(spec: ModelSpec, result: SearchResult, strategy: str, ac: bool) -> int:
    """Per-GPU bytes of `spec` at the smallest searched micro-batch (for 'does not fit' sentences)."""
    hw, s = result.hw, result.settings
    b = result.micro_batches[-1]
    cfg = StepConfig(spec=spec, device_batch_size=b,
                     grad_accum_steps=s.total_batch_tokens // (b * spec.seq_len * hw.num_gpus), dp=hw.num_gpus,
                     precision=s.precision, optimizer=s.optimizer, strategy=strategy,  # type: ignore[arg-type]
                     activation_checkpointing=ac, loss_chunk_tokens=s.loss_chunk_tokens, compile=result.compiled)
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
    need = min_memory(nxt, result, "fsdp", True)
    return (f"{nxt.name} does not fit: even at micro-batch {result.micro_batches[-1]} with fsdp + checkpointing it "
            f"needs {fmt_bytes(need)} > {fmt_bytes(result.capacity)} per GPU.")


def _run_hours(result: SearchResult) -> float | None:
    """The spend in hours that a budget or --hours search gave every run (None for --steps): the same
    length that ranked them (planner.ranking.prefer_simpler), so explain's siblings are the ranking's."""
    return None if result.length.steps is not None else result.spend_hours


def _siblings(result: SearchResult, best: Candidate) -> list[Candidate]:
    """The other settings of the winner's model for the same run length."""
    rh = _run_hours(result)
    f = launch_fixed_s(result)
    key = length_key(best, rh, f)
    return [c for c in result.ranked if c.spec == best.spec and length_key(c, rh, f) == key]


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
        ddp = [c for c in same if c.strategy == "ddp"]   # fits at any length (a faster setting runs more steps)
        if ddp:
            d = min(ddp, key=lambda c: c.step_seconds)
            dmax = max(c.device_batch for c in ddp if c.activation_checkpointing == d.activation_checkpointing)
            limit = (f" (the largest micro-batch ddp fits{' with checkpointing' if d.activation_checkpointing else ''})"
                     if d.device_batch == dmax and dmax < best.device_batch else "")
            out.append(f"Strategy {best.strategy}: ddp's fastest setting, micro-batch {d.device_batch}"
                       f"{' + AC' if d.activation_checkpointing else ''}{limit}, is {_slower(d, best)}.")
        else:
            need = min_memory(best.spec, result, "ddp", True)
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
            need = min_memory(best.spec, result, "fsdp", False)
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
                     compile=result.compiled)
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
                     activation_checkpointing=ac, loss_chunk_tokens=s.loss_chunk_tokens, compile=result.compiled)
    return memory_of(cfg, hw).total

