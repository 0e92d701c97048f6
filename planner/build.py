"""Build a Plan from a PlanRequest, choose the micro-batch, and re-derive plans to check them."""

from __future__ import annotations

import math

from planner import __version__
from planner.cadence import cadence_warning, check_cadence
from planner.counts import flops_per_token, matmul_params, matrix_params, n_params, param_counts
from planner.errors import PlanError
from planner.fit_verdict import RUNNER_ALLOCATOR, Allocator, FitVerdict, verdict_for
from planner.launch import torchrun_command
from planner.memory import estimate
from planner.memory_terms import MemoryEstimate, StepConfig, residual_bytes
from planner.parallelism import RUNNER_HINT, check_parallelism, data_parallel_degree, hsdp_shard, runner_problem
from planner.plan import (
    BudgetPlan,
    HardwarePlan,
    LaunchPlan,
    MemoryPlan,
    ModelPlan,
    Plan,
    PlanRequest,
    SchedulePlan,
    SpotPlan,
    ThroughputPlan,
    TrainerRef,
    TrainingPlan,
)
from planner.precision_choice import PURE_BF16_WARNING
from planner.profiles import Hardware, parse_gpu_spec, speed_off, speed_off_words
from planner.startup import fixed_seconds, paid_seconds, steps_within
from planner.throughput import Throughput, estimate_throughput
from planner.trainers import step_speed_inputs, trainer_for
from planner.uncertainty import plan_uncertainty
from planner.units import fmt_bytes, fmt_count, fmt_duration, plural

UNDERTRAINED_TOKENS_PER_PARAM = 10.0   # below this: undertrained (Chinchilla's optimum is ~20)
MAX_EPOCHS = 4.0                       # Muennighoff et al. 2023: ~4 epochs ≈ fresh data
LARGE_STORAGE_BYTES = 1 << 40          # warn above 1 TiB of checkpoints


def hardware_of(req: PlanRequest) -> Hardware:
    if req.spot is not None:     # the provider's spot price (planner/spot_plan.py, imported for spot plans only)
        from planner.spot_plan import spot_hardware  # noqa: PLC0415

        return spot_hardware(req)
    return parse_gpu_spec(req.gpu, profile=req.profile, provider=req.provider, price=req.price)


def batch_choices(total_batch_tokens: int, seq_len: int, num_gpus: int) -> list[int]:
    """Device batch sizes (descending) that divide the target batch exactly."""
    per = seq_len * num_gpus
    if total_batch_tokens % per:
        p2 = 2 ** round(math.log2(total_batch_tokens))     # '1M' meant 2**20 more often than 1,000,000
        two = f", or {p2:,} (2^{p2.bit_length() - 1})" if p2 % per == 0 else ""
        raise PlanError("--total-batch-tokens",
                        f"{total_batch_tokens:,} is not a multiple of seq_len × GPUs = {per:,}",
                        f"use a multiple such as {max(1, round(total_batch_tokens / per)) * per:,}{two}")
    rows = total_batch_tokens // per
    return [b for b in range(rows, 0, -1) if rows % b == 0]


def grad_accum(total_batch_tokens: int, device_batch: int, seq_len: int, num_gpus: int) -> int:
    micro = device_batch * seq_len * num_gpus
    if total_batch_tokens % micro:
        choices = batch_choices(total_batch_tokens, seq_len, num_gpus)
        raise PlanError("--device-batch-size",
                        f"device batch {device_batch} × seq {seq_len} × {plural(num_gpus, 'GPU')} = {micro:,} tokens "
                        f"does not divide the total batch {total_batch_tokens:,}",
                        f"use one of {', '.join(map(str, choices[:8]))}")
    return total_batch_tokens // micro


def step_config(req: PlanRequest, device_batch: int, num_gpus: int) -> StepConfig:
    dp = data_parallel_degree(num_gpus, req.tp)     # a tensor-parallel group shares each micro-batch
    return StepConfig(
        spec=req.model, device_batch_size=device_batch,
        grad_accum_steps=grad_accum(req.total_batch_tokens, device_batch, req.model.seq_len, dp),
        dp=dp, precision=req.precision, optimizer=req.optimizer, strategy=req.strategy,
        activation_checkpointing=req.activation_checkpointing, loss_chunk_tokens=req.loss_chunk_tokens,
        compile=req.compile, ac_every=req.ac_every, ac_policy=req.ac_policy, fp8=req.fp8,
        separate_projections=_separate_projections(req), tp=req.tp, sequence_parallel=req.sequence_parallel,
        hsdp_shard=hsdp_shard(req.strategy, hardware_of(req).gpus_per_node, req.tp) if req.strategy == "hsdp" else 0,
    )


def _separate_projections(req: PlanRequest) -> bool:
    """Whether the plan's trainer runs q, k, v (and gate, up) as separate linears (planner.checkpointing)."""
    tr = trainer_for(req.trainer)
    return tr is not None and tr.separate_projections


def memory_of(cfg: StepConfig, hw: Hardware, trainer: TrainerRef | None = None) -> MemoryEstimate:
    """Per-GPU memory of the step; another trainer's step (planner/trainers/) where the plan names one."""
    ov = hw.profile.overheads
    over = {"cuda_context": ov.cuda_context_bytes} if hw.profile.kind == "gpu" else {}
    if hw.num_gpus > 1 and hw.profile.kind == "gpu":
        over["nccl_buffers"] = ov.nccl_bytes
    frag = ov.fragmentation if hw.profile.kind == "gpu" else 0.0
    tr = trainer_for(trainer)
    if tr is not None:
        return tr.memory(cfg, trainer, over, frag)  # type: ignore[arg-type]
    return estimate(cfg, overheads=over, fragmentation=frag)


def allocator_of(req: PlanRequest) -> Allocator:
    """How the plan's trainer configures the CUDA allocator (planner.fit_verdict)."""
    tr = trainer_for(req.trainer)
    return tr.allocator if tr is not None else RUNNER_ALLOCATOR


def verdict_of(req: PlanRequest, mem: MemoryEstimate, hw: Hardware, headroom: float | None = None) -> FitVerdict:
    """fits / tight / does not fit for the plan's step (planner.fit_verdict), with its trainer's allocator."""
    return verdict_for(mem.allocated_peak, hw, req.headroom if headroom is None else headroom, allocator_of(req))


def fits(mem: MemoryEstimate, hw: Hardware, headroom: float) -> bool:
    return mem.total <= hw.profile.usable_bytes * (1.0 - headroom)


def choose_batch(req: PlanRequest, hw: Hardware) -> int:
    """The largest device batch that divides the target batch and fits in memory."""
    choices = batch_choices(req.total_batch_tokens, req.model.seq_len, data_parallel_degree(hw.num_gpus, req.tp))
    for b in choices:
        if fits(memory_of(step_config(req, b, hw.num_gpus), hw, req.trainer), hw, req.headroom):
            return b
    return choices[-1]


def _warnings(req: PlanRequest, hw: Hardware, mem: MemoryEstimate, fit: bool, sched: SchedulePlan,
              n: int, limited: str = "", per: str = "param") -> list[str]:
    out = []
    cap = hw.profile.usable_bytes * (1 - req.headroom)
    v = verdict_of(req, mem, hw)
    if v.verdict == "tight":
        out.append(v.warning())
    elif not fit:
        fix = ("try a smaller device batch, --activation-checkpointing, or --strategy zero1/zero2/fsdp"
               if req.trainer.name == "nanoplan" else f"see what {req.trainer.name} can do in docs/trainers.md")
        out.append(f"does not fit: {fmt_bytes(mem.total)} per GPU > {fmt_bytes(cap)} usable after "
                   f"{req.headroom:.0%} headroom; {fix}")
    if sched.tokens_per_param < UNDERTRAINED_TOKENS_PER_PARAM and req.max_epochs and sched.epochs \
            and sched.epochs >= req.max_epochs * 0.999:
        out.append(f"data-limited: {sched.tokens_per_param:.1f} tokens/{per} after {sched.epochs:.1f} epochs "
                   f"(--max-epochs {req.max_epochs:g}); more unique data would let this model train longer")
    elif limited == "epochs":
        asked = "--budget" if req.budget_usd is not None else "--hours" if req.hours is not None else "--steps"
        out.append(f"stops at {req.max_epochs:g} epochs of {fmt_count(sched.dataset_tokens or 0)} tokens, short of "
                   f"{asked}; --max-epochs N trains longer on repeats (past {MAX_EPOCHS:.0f} they lose value)")
    elif sched.tokens_per_param < UNDERTRAINED_TOKENS_PER_PARAM:
        out.append(f"undertrained: {sched.tokens_per_param:.1f} tokens/{per} (< {UNDERTRAINED_TOKENS_PER_PARAM:.0f}; "
                   f"Chinchilla-optimal is ~20); a smaller model or more hours would use the budget better")
    if sched.epochs is not None and sched.epochs > MAX_EPOCHS:
        out.append(f"repeated data: {sched.epochs:.1f} epochs over {fmt_count(sched.dataset_tokens or 0)} tokens "
                   f"(> {MAX_EPOCHS:.0f}; Muennighoff et al. 2023 find repeats lose value beyond ~4); "
                   "use a bigger dataset, a smaller model or fewer hours")
    if sched.storage_bytes > LARGE_STORAGE_BYTES:
        out.append(f"checkpoint storage is large: {fmt_bytes(sched.storage_bytes)} "
                   f"(keep_last={sched.keep_last} plus best); lower --keep-last")
    if req.precision == "bf16":
        out.append(PURE_BF16_WARNING)
    if req.trainer.name == "nanoplan" and (no_run := runner_problem(req)):
        out.append(f"{no_run}: {RUNNER_HINT}")
    if hw.usd_per_gpu_hour == 0 and req.budget_usd is not None:
        out.append("price is 0, so a dollar budget cannot bound the run")
    if (c := speed_off(hw.profile)) is not None:
        out.append(f"speed unproven on {hw.profile.name}: predicted tokens/s {speed_off_words(c)} ({c.rows}); "
                   f"this plan is {'optimistic' if c.median_ratio > 1 else 'pessimistic'}")
    return out


def _too_short(req: PlanRequest, hw: Hardware, hours: float, limited: str, step_s: float, fixed_s: float) -> PlanError:
    """The error of a length that trains no step after the launch's start-up; the hint names a batch that would."""
    what = (f"{fmt_duration(hours * 3600)}" if limited == "hours" else
            f"${req.budget_usd:.3g} buys {fmt_duration(hours * 3600)} of {hw.spec}, which")
    tokens, per = req.total_batch_tokens, req.model.seq_len * hw.num_gpus
    left = hours * 3600 - fixed_s          # for one step, at half the time a step scales with (its fixed costs)
    rows = max(1, math.floor(tokens * left / (2 * step_s) / per) if left > 0 else 1)
    smaller = (f"a smaller batch such as --total-batch-tokens {rows * per:,} ({plural(rows, 'sequence')} of "
               f"{req.model.seq_len:,} per GPU), " if rows * per < tokens else "")
    return PlanError("--hours" if limited == "hours" else "--budget",
                     f"{what} leaves no time for one optimizer step of {tokens:,} tokens ({fmt_duration(step_s)}) after "
                     f"the launch's start-up{' and compile warm-up' if req.compile else ''} ({fmt_duration(fixed_s)}); "
                     "nothing would train",
                     f"give {smaller}a longer --hours or a larger --budget, or --steps N")


def checkpoint_disk_bytes(num_checkpoints: int, keep_last: int, checkpoint_bytes: int) -> int:
    """The most checkpoint bytes on disk at once: the kept ones (keep_last + the best) plus the one being
    written, since retention frees an old checkpoint only after the new one is complete. The runner also
    writes one right after step 1 (to time the write) and a final one, so at most num_checkpoints + 2 exist.
    plan.schedule.storage_bytes and the runner's preflight both use this."""
    return min(num_checkpoints + 2, keep_last + 2) * checkpoint_bytes


def build_plan(req: PlanRequest, plan_path: str = "plan.json") -> Plan:
    """Derive every number of a plan from its request."""
    hw = hardware_of(req)
    spec = req.model
    g = hw.num_gpus
    if req.fp8 and not (hw.profile.speed is not None and hw.profile.speed.fp8_matmul_tflops):
        raise PlanError("--fp8", f"{hw.profile.name} has no FP8 matmuls in its profile",
                        "drop --fp8, or plan a GPU with FP8 (H100, H200, B200, L4, L40S, RTX 4090)")
    tr = trainer_for(req.trainer)
    check_parallelism(req, hw, tr)
    b = req.device_batch_size or choose_batch(req, hw)
    cfg = step_config(req, b, g)
    mem = memory_of(cfg, hw, req.trainer)
    verdict = verdict_of(req, mem, hw)
    fit = verdict.runs       # plan.memory.fits: not refused (fits or tight); the verdict says which
    variant, software = step_speed_inputs(req, hw.profile)   # the trainer's step and attention kernel
    tp: Throughput = estimate_throughput(cfg, hw, mfu=req.mfu, variant=variant, software=software)
    usd_per_hour = g * hw.usd_per_gpu_hour

    # the hours are the launch's paid hours: start-up and compile warm-up, then the steps (planner/startup.py)
    fixed_s = fixed_seconds(hw.profile.kind, hw.nodes, req.compile, req.startup_seconds)
    if req.steps is not None:
        steps = req.steps
        hours = paid_seconds(steps, tp.step_seconds, fixed_s) / 3600
        limited = "steps"
    else:
        if req.hours is not None:
            hours, limited = req.hours, "hours"
        else:
            if usd_per_hour <= 0:
                raise PlanError("--budget", f"the price of {hw.spec} is $0/h, so a dollar budget sets no length",
                                "give --price USD_PER_GPU_HOUR, --hours H or --steps N")
            hours, limited = req.budget_usd / usd_per_hour, "budget"
        steps = steps_within(hours * 3600, tp.step_seconds, fixed_s)
        if steps < 1:     # not even one optimizer step: a plan of one step would overrun what was asked
            raise _too_short(req, hw, hours, limited, tp.step_seconds, fixed_s)
    if req.max_epochs is not None and req.dataset_tokens:
        cap = max(1, math.floor(req.max_epochs * req.dataset_tokens / tp.tokens_per_step))
        if steps > cap:
            steps, limited = cap, "epochs"
            hours = paid_seconds(steps, tp.step_seconds, fixed_s) / 3600

    N = tr.counts(spec, req.trainer).n_params if tr is not None else n_params(spec)
    N_ratio, per = tr.ratio_params(spec, req.trainer) if tr is not None else (N, "param")   # what tokens/param counts
    w_bytes = 2 if req.precision == "bf16" else 4
    model_file = N * w_bytes
    opt_elems = 2 * N if req.optimizer == "adamw" else (matrix_params(spec) + 2 * (N - matrix_params(spec)))
    opt_full = opt_elems * w_bytes
    sharded = req.strategy in ("zero1", "zero2", "fsdp")
    opt_rank = opt_full // g if sharded else opt_full // (cfg.hsdp_shard * req.tp) if cfg.hsdp_shard else \
        opt_full // req.tp
    ckpt_bytes = model_file + opt_full
    spot: SpotPlan | None = None
    ckpt_minutes = req.checkpoint_every_minutes
    if req.spot is not None:     # spot GPUs: the steps that finish within the cap, the Young/Daly cadence
        from planner.spot_plan import spot_length  # noqa: PLC0415

        steps, hours, limited, spot = spot_length(req, hw, tp, ckpt_bytes)
        ckpt_minutes = spot.checkpoint_every_minutes
    usd = hours * usd_per_hour

    tokens = steps * tp.tokens_per_step
    epochs = tokens / req.dataset_tokens if req.dataset_tokens else None
    ckpt_steps = max(1, round(ckpt_minutes * 60 / tp.step_seconds))
    n_ckpt = max(1, math.ceil(steps / ckpt_steps))
    bps = req.profile.storage_bytes_per_s()[0]
    check_cadence(ckpt_minutes, ckpt_bytes, bps, "--checkpoint-every-minutes")     # planner/cadence.py
    cad_warn = cadence_warning(n_ckpt, ckpt_bytes, bps, steps * tp.step_seconds, ckpt_steps, ckpt_minutes)
    storage = checkpoint_disk_bytes(n_ckpt, req.keep_last, ckpt_bytes)

    sched = SchedulePlan(
        total_steps=steps, tokens_per_step=tp.tokens_per_step, total_tokens=tokens,
        tokens_per_param=tokens / N_ratio, dataset_tokens=req.dataset_tokens, epochs=epochs,
        checkpoint_every_minutes=ckpt_minutes, checkpoint_every_steps=ckpt_steps,
        num_checkpoints=n_ckpt, model_file_bytes=model_file, optimizer_bytes_per_rank=opt_rank,
        checkpoint_bytes=ckpt_bytes, keep_last=req.keep_last, storage_bytes=storage,
    )
    eff_mfu = tp.tokens_per_sec * tp.flops_per_token / (g * tp.peak_flops_per_gpu)
    return Plan(
        created_by=f"nanoplan {__version__}",
        request=req,
        hardware=HardwarePlan(spec=hw.spec, profile_name=hw.profile.name, nodes=hw.nodes,
                              gpus_per_node=hw.gpus_per_node, num_gpus=g, provider=hw.provider,
                              usd_per_gpu_hour=hw.usd_per_gpu_hour, price_date=hw.price_date,
                              price_source=hw.price_source),
        model=_model_plan(req),
        training=TrainingPlan(device_batch_size=b, grad_accum_steps=cfg.grad_accum_steps,
                              total_batch_tokens=req.total_batch_tokens, seq_len=spec.seq_len,
                              precision=req.precision, optimizer=req.optimizer, strategy=req.strategy,
                              activation_checkpointing=req.activation_checkpointing,
                              loss_chunk_tokens=req.loss_chunk_tokens, compile=req.compile,
                              residual_dtype="bf16" if residual_bytes(req.precision) == 2 else "fp32",
                              ac_every=req.ac_every, ac_policy=req.ac_policy, fp8=req.fp8,
                              **_parallel_fields(req, cfg)),
        memory=MemoryPlan(per_gpu_bytes=mem.total, capacity_bytes=int(hw.profile.usable_bytes * (1 - req.headroom)),
                          usable_bytes=hw.profile.usable_bytes, headroom=req.headroom, fits=fit,
                          peak_phase=mem.peak_phase, breakdown=mem.breakdown, overhead=mem.overhead,
                          phases=mem.phases, verdict=verdict.verdict),
        throughput=ThroughputPlan(mfu=tp.mfu, effective_mfu=min(1.0, eff_mfu), peak_flops_per_gpu=tp.peak_flops_per_gpu,
                                  tokens_per_sec=tp.tokens_per_sec, step_seconds=tp.step_seconds,
                                  compute_seconds=tp.compute_seconds, comm_seconds=tp.comm_seconds,
                                  exposed_comm_seconds=tp.exposed_comm_seconds,
                                  optimizer_seconds=tp.optimizer_seconds, micro_step_seconds=tp.micro_step_seconds),
        budget=BudgetPlan(usd=usd, hours=hours, usd_per_hour=usd_per_hour, limited_by=limited,
                          startup_seconds=fixed_s),
        schedule=sched,
        launch=LaunchPlan(run_dir=req.run_dir,
                          command=torchrun_command(plan_path, hw.gpus_per_node, req.run_dir, nnodes=hw.nodes,
                                                   node_rank="$NODE_RANK" if hw.nodes > 1 else 0,
                                                   python="python") if tr is None else
                          _trainer_argv(req.model_copy(update={"device_batch_size": b}), hw.nodes, hw.gpus_per_node,
                                        steps, ckpt_steps)),
        spot=spot,
        warnings=_warnings(req, hw, mem, fit, sched, N, limited, per) + (_spot_warnings(req, spot) if spot else [])
        + ([cad_warn] if cad_warn else []),
        uncertainty=plan_uncertainty(  # P10–P90 from the model's held-out errors on similar public runs
            gpu_profile=hw.profile.name, kind_gpu=hw.profile.kind == "gpu", trainer=req.trainer.name,
            compiled=req.compile, nodes=hw.nodes, tokens_per_sec=tp.tokens_per_sec,
            flat_mfu=req.mfu is not None or bool(hw.profile.mfu_curve) or hw.profile.speed is None,
            hours=hours, usd_per_hour=usd_per_hour, total_tokens=tokens, tokens_per_step=tp.tokens_per_step,
            limited_by=limited),
    )


def _parallel_fields(req: PlanRequest, cfg: StepConfig) -> dict[str, object]:
    """TrainingPlan's tensor-parallel and HSDP fields (planner/parallelism.py); their defaults when neither is used."""
    if req.tp == 1 and req.strategy != "hsdp":
        return {}
    return {"tp": req.tp, "sequence_parallel": req.sequence_parallel, "data_parallel": cfg.dp,
            "hsdp_shard": cfg.hsdp_shard or None}


def _spot_warnings(req: PlanRequest, spot: SpotPlan) -> list[str]:
    from planner.spot_plan import spot_warnings  # noqa: PLC0415  (spot plans only: a lighter start-up)

    return spot_warnings(req, spot)


def _trainer_argv(req: PlanRequest, nodes: int, gpus_per_node: int, steps: int, ckpt_steps: int) -> list[str]:
    """Another trainer's launch line (planner/trainers/launch_files.py: imported for those plans only)."""
    from planner.trainers.launch_files import launch_argv  # noqa: PLC0415

    return launch_argv(req, nodes, gpus_per_node, steps, ckpt_steps)


def _model_plan(req: PlanRequest) -> ModelPlan:
    """The model's counts: the trainer's own (planner/trainers/) where the plan names one."""
    spec = req.model
    tr = trainer_for(req.trainer)
    if tr is not None:
        c = tr.counts(spec, req.trainer)
        return ModelPlan(name=spec.name, n_params=c.n_params, params_by_group=c.by_group,
                         matmul_params=c.matmul_params, flops_per_token=c.flops_per_token)
    return ModelPlan(name=spec.name, n_params=n_params(spec), params_by_group=param_counts(spec).as_dict(),
                     matmul_params=matmul_params(spec), flops_per_token=flops_per_token(spec))


def _show(v: object) -> str:
    """A value in a sentence: a command as a shell line, a number with its digits, text as it is."""
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        import shlex  # noqa: PLC0415

        return shlex.join(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "none" if v is None else str(v)


def _diff(path: str, stored: object, fresh: object, out: list[str]) -> None:
    if isinstance(stored, dict) and isinstance(fresh, dict):
        for k in sorted(set(stored) | set(fresh)):
            _diff(f"{path}.{k}" if path else k, stored.get(k), fresh.get(k), out)
    elif isinstance(stored, float) or isinstance(fresh, float):
        if stored is None or fresh is None or not math.isclose(float(stored), float(fresh), rel_tol=1e-6, abs_tol=1e-9):
            out.append(f"{path} is {_show(stored)} in the plan, {_show(fresh)} re-derived")
    elif stored != fresh:
        out.append(f"{path} is {_show(stored)} in the plan, {_show(fresh)} re-derived")


def rederive(plan: Plan, plan_path: str | None = None) -> tuple[Plan, list[str]]:
    """Rebuild a plan from its request; return the fresh plan and any stale or tampered fields.

    The launch line names the file estimate wrote (`--plan PATH`): a plan copied or moved elsewhere is the same
    plan, so the comparison rebuilds it at its recorded path whatever `plan_path` (where it is now) says, and
    `run` and `validate` agree on it."""
    del plan_path     # where the plan is now: not a derived number
    fresh = build_plan(plan.request, plan_path=_plan_path_in(plan))
    problems: list[str] = []
    s, f = plan.model_dump(mode="json"), fresh.model_dump(mode="json")
    for key in ("hardware", "model", "training", "memory", "throughput", "budget", "schedule", "launch", "spot"):
        _diff(key, s[key], f[key], problems)
    return fresh, problems


def _plan_path_in(plan: Plan) -> str:
    cmd = plan.launch.command
    return cmd[cmd.index("--plan") + 1] if "--plan" in cmd else "plan.json"
