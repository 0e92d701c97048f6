"""benchmarks/public_runs/adapter.py: each public row becomes the planner's inputs faithfully.

Independent references: the parameter counts the sources print (llm-foundry's NumParams, nanochat's report)
and the sources' own tokens/s where a row gives two measures of its speed.
"""

from __future__ import annotations

import pytest

from benchmarks.public_runs.adapter import inputs, measured_tokens_per_s
from benchmarks.public_runs.schema import load_runs
from planner.counts import n_params

RUNS = load_runs()


@pytest.mark.parametrize("row", [r for r in RUNS if r.n_params_reported], ids=lambda r: r.id)
def test_the_model_has_the_sources_parameter_count(row) -> None:
    assert n_params(inputs(row).spec) == row.n_params_reported


@pytest.mark.parametrize("row", RUNS, ids=lambda r: r.id)
def test_batch_and_hardware_are_the_rows(row) -> None:
    inp = inputs(row)
    assert inp.hw.num_gpus == row.total_gpus and inp.hw.gpus_per_node == row.gpus_per_node   # every GPU, TP too
    assert inp.hw.nodes == row.nodes
    assert inp.cfg.dp == row.dp_degree and inp.cfg.tp == inp.mem_cfg.tp == row.tp_degree
    assert inp.cfg.device_batch_size == row.micro_batch_per_gpu
    if row.global_batch_seqs:
        assert inp.cfg.device_batch_size * inp.cfg.dp * inp.cfg.grad_accum_steps == row.global_batch_seqs
    assert inp.mem_cfg.compile == row.compile
    assert inp.cfg.compile == (row.compile or row.fused_elementwise)     # the speed: fused kernels count as compiled
    assert inp.cfg.activation_checkpointing == (row.activation_checkpointing != "none")


def test_two_measures_of_one_speed_agree() -> None:
    """nanochat's A100 row logs both tok/sec (one micro-batch per step, no accumulation) and the step time."""
    row = next(r for r in RUNS if r.id == "nanochat-d20-a100x8-b32")
    from_step, how = measured_tokens_per_s(row)
    assert how == "step time"
    assert from_step == pytest.approx(row.measured_tokens_per_s_total, rel=1e-3)
    mfu = row.measured_mfu_pct / 100 * row.total_gpus * row.mfu_basis_peak_tflops * 1e12 / row.mfu_basis_flops_per_token
    assert from_step == pytest.approx(mfu, rel=0.01)


def test_heldout_speed_error_and_verdicts() -> None:
    """On rows no constant was fitted to, what benchmarks/results/public_runs.md reports (2026-11-28): held-out median
    |tokens/s error| 4.9% (issue 29's bar is 5%, met at the edge: docs/throughput.md, the sixth pass), 25 of the 29
    within 10%, and no wrong fit verdict on any row whose outcome is known. Every row counts, the tensor-parallel ones
    too. The median's guard is the bar, which the value measured meets by 0.1 point: a change that makes it worse
    fails here."""
    import statistics

    from benchmarks.public_runs.adapter import predict

    preds = [predict(r) for r in RUNS]
    held = [abs(p.error) for p in preds if p.row.split == "heldout" and p.error is not None]
    assert len(held) == 29 and statistics.median(held) <= 0.05
    assert sum(1 for e in held if e <= 0.10) >= 25
    assert all(p.verdict_ok for p in preds)


def test_tensor_parallel_rows_are_planned_with_tp_and_land_like_the_others() -> None:
    """torchtitan's 2-D rows (FSDP x TP 8) are planned as `--tp 8` with sequence parallelism on their own 256 or 64
    GPUs (no TP group merged into one device), count in the fit and the tables, and land within 20% of what they
    measured, as every row does on a GPU whose speed is proven; the 70B ones within 6%."""
    from benchmarks.fit_speed import fit_rows
    from benchmarks.public_runs.adapter import predict
    from planner.throughput import estimate_throughput

    tp_rows = [r for r in RUNS if r.tp_degree > 1]
    assert len(tp_rows) == 6 and {r.strategy for r in tp_rows} == {"fsdp+tp"}
    assert sum(1 for r, _ in fit_rows(RUNS) if r.tp_degree > 1) == 4          # the calibration ones are fitted on
    for r in tp_rows:
        p = predict(r)
        c = p.inputs.cfg
        assert (c.tp, c.sequence_parallel, c.strategy, c.dp) == (8, True, "fsdp", r.total_gpus // 8), r.id
        assert p.inputs.hw.num_gpus == r.total_gpus and p.inputs.hw.gpus_per_node == 8
        assert p.verdict_ok and p.error is not None and abs(p.error) <= 0.20, (r.id, p.error)
        if r.n_layer == 80:
            assert abs(p.error) <= 0.06, (r.id, p.error)
        # a step's tokens: one micro-batch per data-parallel rank, shared by its TP group (the source's global batch)
        step = estimate_throughput(c, p.inputs.hw, software=p.inputs.software)
        assert step.tokens_per_step == r.global_batch_seqs * r.seq_len


def test_each_profiles_public_check_is_what_the_benchmark_measures() -> None:
    """hardware_profiles/*.yaml `speed.public_check` = the median predicted / measured ratio and row count that
    benchmarks/public_runs.py gets for that GPU today (re-measure and update both when the model changes)."""
    import statistics
    from collections import defaultdict

    from benchmarks.public_runs.adapter import predict
    from planner.profiles import builtin_profiles

    errors: dict[str, list[float]] = defaultdict(list)
    for r in load_runs():
        p = predict(r)
        if p.error is not None:
            errors[r.gpu].append(p.error)
    for name, prof in builtin_profiles().items():
        c = prof.speed.public_check if prof.speed is not None else None
        if name not in errors:
            assert c is None, name
            continue
        assert c is not None and c.runs == len(errors[name]), name
        assert c.median_ratio == pytest.approx(1 + statistics.median(errors[name]), abs=0.0005), name


def test_a_gpu_whose_speed_is_off_says_so_in_the_plan_and_in_compare() -> None:
    from planner.build import build_plan
    from planner.candidates import Length, depth_ladder
    from planner.compare import compare
    from planner.plan import PlanRequest
    from planner.profiles import find_profile
    from planner.spec import nanochat

    def plan(gpu: str):  # noqa: ANN202
        return build_plan(PlanRequest(gpu=f"8x{gpu}", profile=find_profile(gpu), model=nanochat(20), hours=1.0))

    assert any(w.startswith("speed unproven on B200: predicted tokens/s +98% vs its 2 public runs (") and
               w.endswith("this plan is optimistic") for w in plan("B200").warnings)
    assert not any(w.startswith("speed unproven") for w in plan("H100").warnings + plan("A100-80GB").warnings
                    + plan("H200").warnings)     # H200: -1% (issue 29: kernels, Grand Teton compute)
    slow = find_profile("H200")
    slow = slow.model_copy(update={"speed": slow.speed.model_copy(update={"public_check": slow.speed.public_check
                                   .model_copy(update={"median_ratio": 0.8})})})
    warned = build_plan(PlanRequest(gpu="8xH200", profile=slow, model=nanochat(20), hours=1.0)).warnings
    assert any(w.startswith("speed unproven on H200: predicted tokens/s -20% vs its 2 public runs")
               and w.endswith("pessimistic") for w in warned)
    cmp = compare(["8xB200", "8xH100"], depth_ladder(), Length(budget_usd=1000))
    notes = {r.gpu: r.note for r in cmp.rows}
    assert notes == {"8xB200": "tokens/s +98% vs its 2 public runs", "8xH100-SXM": ""}


def test_nanochat_rows_are_predicted_through_the_plans_own_calls() -> None:
    """nanochat's rows are `--trainer nanochat` plans: build_plan of the adapter's request gives the same step (memory,
    speed with the trainer's step variant and attention software). The Jan-Feb 2026 rows differ from version 2026-07
    in one fact only, their half-context windows; their FP8 rows run the head in FP8 too (nanochat's
    fp8_module_filter converts every nn.Linear whose dims divide by 16, lm_head included)."""
    from dataclasses import replace

    from benchmarks.public_runs.adapter import memory_of_row, predict
    from planner.build import build_plan
    from planner.throughput import estimate_throughput
    from planner.trainers import step_speed_inputs

    rows = [r for r in RUNS if r.trainer == "nanochat"]
    assert len(rows) == 13
    for r in rows:
        inp = inputs(r)
        plan = build_plan(inp.request)
        assert plan.request.trainer.name == "nanochat" and plan.training.strategy == "zero1"
        assert sum(plan.memory.breakdown.values()) == memory_of_row(inp).allocated_peak, r.id
        variant, software = step_speed_inputs(inp.request, inp.hw.profile)
        if r.arch in ("nanochat-2025-10", "nanochat-2026-07"):    # the modelled versions' own code
            assert (inp.variant, inp.software) == (variant, software)
        else:   # put 2026-07's windows back: then the prediction is the plan's
            assert inp.software.attention_span > software.attention_span and inp.software.attention == "fa3"
            inp = replace(inp, software=software, variant=variant)
            assert variant.fp8_head and inp.cfg.fp8 == (r.precision == "fp8")
        again = estimate_throughput(inp.cfg, inp.hw, software=inp.software, variant=inp.variant)
        assert again.tokens_per_sec == pytest.approx(plan.throughput.tokens_per_sec, rel=1e-9), r.id
    fp8 = next(r for r in rows if r.precision == "fp8" and r.outcome == "ran")
    inp = inputs(fp8)
    bf16_head = estimate_throughput(inp.cfg, inp.hw, software=inp.software, variant=replace(inp.variant, fp8_head=False))
    assert predict(fp8).tokens_per_s > bf16_head.tokens_per_sec * 1.005      # the FP8 head is priced


def test_nanochat_march_2026_records_step_times_and_windows() -> None:
    """The leaderboard's Runs 4-6 give hours and a --target-param-data-ratio, not steps: their step times in runs.yaml
    are total_training_time / (steps - 10) with the steps base_train.py computes, int(ratio x scaling params) // the
    auto total batch. nanoplan's own 2026-07 counts give those steps: 729,810,624 scaling parameters at d24 (what
    gpt.py at 6ed7d1d and a825e63 counts on the meta device) and a 1,048,576-token batch; at 324e69c the value
    embeddings' gates were 32 channels wide, not 12 (12 gated layers x 12 heads x 20 more). Their short windows:
    1,024 (half the context), 768 (a third, rounded up to 128) and 512 (2026-07's quarter)."""
    from benchmarks.public_runs.adapter import leaderboard_windows, spec_of
    from planner.trainers.nanochat import CURRENT, auto_total_batch, model_spec, scaling_params

    spec = model_spec(CURRENT, 24)
    params, batch = scaling_params(spec, CURRENT), auto_total_batch(spec, CURRENT)
    assert (params, batch) == (729_810_624, 1_048_576)
    runs = {r.id.rsplit("-", 1)[1]: r for r in RUNS if "-mar26-" in r.id}
    cases = {"run4": (9.5, 2.02, params + 12 * 12 * 20, 1024), "run5": (8.7, 1.80, params, 768),
             "run6": (8.0, 1.65, params, 512)}
    assert set(runs) == set(cases)
    for name, (ratio, hours, p, short) in cases.items():
        r = runs[name]
        steps = int(ratio * p) // batch
        assert r.measured_step_time_ms == pytest.approx(hours * 3600 / (steps - 10) * 1000, abs=0.005), name
        assert r.micro_batch_per_gpu * r.dp_degree * r.grad_accum_steps * r.seq_len == batch
        if r.arch == "nanochat-2026-07":
            continue
        w = leaderboard_windows(spec_of(r), r.arch)
        assert w[:4] == [short, short, short, 2048] and w[-1] == 2048 and w.count(2048) == 6, name


def test_nanochat_rows_land_within_10_percent_with_its_own_matmul_term() -> None:
    """Issue 29's bar for the trainer most users run: every nanochat row with a speed, planned as `--trainer
    nanochat`, within 10% (they were 8-14% too slow in bf16 before nanochat's own matmul term). The term scales only
    nanochat's matmul time: the same step with the runner's variant is slower by exactly the matmul share it saves."""
    from dataclasses import replace as dc_replace

    from benchmarks.public_runs.adapter import inputs, predict
    from planner.speed_constants import DEFAULT
    from planner.throughput import estimate_throughput

    rows = [r for r in RUNS if r.trainer == "nanochat" and r.outcome == "ran"]
    errors = {r.id: predict(r).error for r in rows}
    assert len(errors) == 10 and all(e is not None and abs(e) <= 0.10 for e in errors.values()), errors
    inp = inputs(next(r for r in rows if r.id == "nanochat-d20-h100x8-b32"))
    assert inp.variant is not None and inp.variant.matmul_constant == "nanochat_matmul"
    own = estimate_throughput(inp.cfg, inp.hw, software=inp.software, variant=inp.variant)
    plain = estimate_throughput(inp.cfg, inp.hw, software=inp.software, variant=dc_replace(inp.variant, matmul_constant=""))
    assert own.matmul_seconds == pytest.approx(plain.matmul_seconds * DEFAULT.nanochat_matmul, rel=1e-9)
    assert (own.attention_seconds, own.elementwise_seconds) == (plain.attention_seconds, plain.elementwise_seconds)
