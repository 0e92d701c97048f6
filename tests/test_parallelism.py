"""HSDP and Megatron-style tensor parallelism in the planner (planned, not run; planner/parallelism.py).

Independent references: per GPU, HSDP holds what fsdp over its shard group holds (FSDP2 on a 2-D mesh shards only
along the shard dimension); Korthikanti et al. 2022 (arXiv 2205.05198): with sequence parallelism every activation
is divided by t, without it the norms' inputs and outputs (10·sbh of their 34·sbh per layer, 8·sbh without
dropout) stay whole, and tensor parallelism costs four all-reduces of a (tokens × d) activation per layer per forward
and backward; ring collectives move (n−1)/n of a tensor per all-gather or reduce-scatter, twice that per all-reduce
(Patarasuk & Yuan 2009). Old plans keep their hash.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.build import build_plan
from planner.counts import n_params
from planner.memory import allocated_peak, estimate
from planner.memory_parallel import replicated_per_token
from planner.memory_terms import StepConfig, dims
from planner.plan import PlanRequest, load_plan, plan_hash, save_plan
from planner.profiles import find_profile
from planner.spec import llama, nanochat
from planner.speed_constants import DEFAULT
from tests.conftest import nanoplan_cli

GiB = 2**30


def request(gpu: str, **kw) -> PlanRequest:
    prof = find_profile(gpu.split("x")[-1])
    return PlanRequest.model_validate({"gpu": gpu, "profile": prof, "model": kw.pop("model", nanochat(20)),
                                       "steps": 10, **kw})


# ------------------------------------------------------------------ memory

def test_hsdp_holds_what_fsdp_over_its_shard_group_holds() -> None:
    base = StepConfig(spec=nanochat(20), device_batch_size=8, grad_accum_steps=2, dp=32, compile=True,
                      loss_chunk_tokens=1024)
    hsdp = replace(base, strategy="hsdp", hsdp_shard=8)
    fsdp8 = replace(base, strategy="fsdp", dp=8)
    assert estimate(hsdp).allocated_peak == estimate(fsdp8).allocated_peak == allocated_peak(hsdp)
    assert estimate(hsdp).allocated_peak > estimate(replace(base, strategy="fsdp")).allocated_peak   # 1/8, not 1/32
    plan = build_plan(request("4x8xH100", strategy="hsdp", device_batch_size=8))
    assert (plan.training.data_parallel, plan.training.hsdp_shard, plan.training.tp) == (32, 8, 1)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_memory_korthikanti(t: int) -> None:
    spec = llama(32, 4096, 32, 8, 14336, seq_len=8192, vocab_size=128256)
    base = StepConfig(spec=spec, device_batch_size=2, dp=8, strategy="fsdp", activation_checkpointing=True,
                      compile=True, loss_chunk_tokens=0)
    whole = estimate(base)
    sp = estimate(replace(base, tp=t))
    assert sp.allocated_peak == whole.allocated_peak // t == allocated_peak(replace(base, tp=t))   # everything ÷ t
    no_sp = replace(base, tp=t, sequence_parallel=False)
    # full checkpointing keeps each block's input, the residual stream: outside the TP region, whole on every GPU
    N, D = 2 * 8192, dims(spec, "bf16-autocast")
    kept_whole = spec.n_layer * D.r * spec.d_model * N * (t - 1) // t
    assert estimate(no_sp).allocated_peak == allocated_peak(no_sp)
    assert estimate(no_sp).allocated_peak - sp.allocated_peak == kept_whole


def test_replicated_bytes_are_korthikantis_10sbh_less_dropout() -> None:
    """Korthikanti et al.'s 10·sbh outside the tensor-parallel region (fp16: two LayerNorm inputs 2sbh each, the
    QKV and MLP inputs 2sbh each, two dropout masks sbh each): with no dropout, 8 bytes per token per d_model, plus
    the two norms' statistics."""
    D = dims(nanochat(20), "bf16-autocast")          # bf16 residual stream (r = 2), bf16 matmul inputs
    assert replicated_per_token(D, compiled=True) == 8 * D.d + 2 * 4


# ------------------------------------------------------------------ speed

def test_hsdp_traffic_is_intra_node_fsdp_plus_a_network_all_reduce() -> None:
    plan = build_plan(request("4x8xH100", strategy="hsdp", device_batch_size=8, compile=True))
    P, accum, prof = n_params(plan.request.model), plan.training.grad_accum_steps, plan.request.profile
    s, R = 8, 4
    nvlink = prof.intra_node_gb_s * 1e9 * DEFAULT.link_efficiency
    nic = prof.inter_node_gb_s * 1e9 * DEFAULT.link_efficiency
    intra = (s - 1) / s * P * (2 * 2 + 4)               # two bf16 all-gathers and an fp32 reduce-scatter
    inter = 2 * (R - 1) / R * P / s * 4                # the fp32 gradient shard all-reduced across the 4 nodes
    assert plan.throughput.comm_seconds == pytest.approx(accum * (intra / nvlink + inter / nic), rel=1e-12)


def test_tensor_parallel_traffic_is_four_all_reduces_per_layer() -> None:
    t = 2                                              # d20: 10 heads
    plan = build_plan(request("8xH100", tp=t, strategy="ddp", device_batch_size=16))
    spec, prof = plan.request.model, plan.request.profile
    P, dp, accum = n_params(spec), 8 // t, plan.training.grad_accum_steps
    assert plan.training.data_parallel == dp and plan.schedule.tokens_per_step == 524_288
    assert plan.training.device_batch_size * spec.seq_len * dp * accum == 524_288
    nvlink = prof.intra_node_gb_s * 1e9 * DEFAULT.link_efficiency
    all_reduce = 2 * (t - 1) / t * 16 * spec.seq_len * spec.d_model * 2         # bf16 (tokens × d)
    tp_bytes = accum * (4 * spec.n_layer + 2) * all_reduce                     # + the embedding's and the head's
    dp_bytes = 2 * (dp - 1) / dp * P / t * 4                                   # ddp's fp32 gradients, 1/t of them
    assert plan.throughput.comm_seconds == pytest.approx((tp_bytes + dp_bytes) / nvlink, rel=1e-12)
    assert plan.throughput.exposed_comm_seconds >= tp_bytes / nvlink * (1 - 1e-12)     # none of it hidden


# ------------------------------------------------------------------ the plan, the CLI, the runner

def test_old_plans_keep_their_hash_and_tp_changes_it(tmp_path) -> None:
    plan = build_plan(request("8xH100", strategy="zero1"))
    doc = plan.model_dump(mode="json")
    for part, keys in (("request", ("tp", "sequence_parallel")),
                       ("training", ("tp", "sequence_parallel", "data_parallel", "hsdp_shard"))):
        for k in keys:
            del doc[part][k]                                   # as a plan written before issue 29
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_plan(tmp_path / "old.json")
    assert plan_hash(old) == plan_hash(plan) and old.request.tp == 1
    tp2 = build_plan(request("8xH100", strategy="zero1", tp=2))
    assert plan_hash(tp2) != plan_hash(plan) and tp2.training.tp == 2


def test_what_cannot_be_expressed_is_refused(capsys, tmp_path) -> None:
    for args, field in ((["--depth", "20", "--tp", "3"], "--tp"),                       # not a divisor of 8
                        (["--trainer", "nanochat", "--depth", "20", "--tp", "2"], "--tp"),
                        (["--budget", "100", "--tp", "2"], "--tp"),                       # the search: not searched
                        (["--depth", "20", "--tp", "16"], "--tp")):
        code, out, err = nanoplan_cli(["estimate", "--gpu", "8xH100", "--steps", "10", *args], capsys, tmp_path)
        assert code == 2 and f"error: {field}" in err, (args, err)


def test_the_runner_refuses_hsdp_and_tp_plans_and_torchtitan_plans_them(capsys, tmp_path) -> None:
    save_plan(build_plan(request("2x8xH100", strategy="hsdp")), tmp_path / "h.json")
    assert any("planned for export and comparison" in w for w in load_plan(tmp_path / "h.json").warnings)
    code, out, err = nanoplan_cli(["run", "h.json", "--dry-run"], capsys, tmp_path)
    assert code == 2 and "runs ddp, zero1, zero2 and fsdp only" in err
    from planner.errors import PlanError
    from runner.distributed import grad_accum_for
    with pytest.raises(PlanError, match="hsdp"):
        grad_accum_for(load_plan(tmp_path / "h.json"), 16, force=False)
    code, out, err = nanoplan_cli(["estimate", "--trainer", "torchtitan", "--preset", "70B", "--gpu", "32x8xH100",
                                   "--tp", "8", "--ac-mode", "full", "--device-batch-size", "16",
                                   "--total-batch-tokens", str(512 * 8192), "--steps", "10", "--out", "t.json"],
                                  capsys, tmp_path)
    plan = load_plan(tmp_path / "t.json")
    assert code == 0 and (plan.training.tp, plan.training.data_parallel) == (8, 32), err
    assert not any("planned for export" in w for w in plan.warnings)
