"""The trainers' current recipes (issue 32 item 3): what nanochat, torchtitan and DeepSpeed do by themselves today.

Each expectation is computed here from the trainer's own source, read at the cited commit, not from nanoplan's code:
- nanochat 92d63d4 scripts/base_train.py: the total batch of `--total-batch-size -1` (its default) is
  2**round(log2(2**19 × (D/D_ref)**0.383)), D = 12 × (transformer matrices + lm_head) and D_ref the same for d12;
  `--fp8` (H100+) converts every nn.Linear whose dims divide by 16 and are at least 128; nanochat/gpt.py's windows
  (S = -(-T // 4 // 128) * 128, the last layer L); nanochat/flash_attention.py's Flash Attention 3 on Hopper only.
- torchtitan 0.3.0's own ConfigManager and main's flags at b5bcd76 (planner/trainers/flags.py).
- deepspeed 0.19.8 as installed (importorskip), uploaded to the package index 2026-10-20.
"""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path

import pytest

from planner.compute_model import StepVariant, compute_terms, matmul_rate
from planner.counts import matmul_params
from planner.plan import Plan, load_plan
from planner.profiles import find_profile
from planner.spec import nanochat as nanochat_spec
from planner.trainers.flags import NANOCHAT_FLAGS, TORCHTITAN_MAIN_AC, TORCHTITAN_MAIN_FLAGS
from tests.conftest import nanoplan_cli
from tests.errlines import error_and_hint

cli = nanoplan_cli


def make(tmp_path: Path, capsys, *args: str, name: str = "plan.json") -> Plan:
    code, _, err = cli(["estimate", *args, "--out", name], capsys, tmp_path)
    assert code == 0, err
    return load_plan(tmp_path / name)


def base_train_flags(tmp_path: Path, capsys, plan: str = "plan.json") -> dict[str, object]:
    """The exported base_train.sh's flags, parsed as nanochat 92d63d4's argparse would (its flags and types)."""
    code, out, err = cli(["export", plan, "--for", "nanochat"], capsys, tmp_path)
    assert code == 0, err
    line = [x for x in out.splitlines() if x.startswith("torchrun ")][-1]
    args = shlex.split(line)[shlex.split(line).index("--") + 1:]
    p = argparse.ArgumentParser(exit_on_error=False)
    for name, typ in NANOCHAT_FLAGS["2026-07"].items():
        p.add_argument(name, action="store_true") if typ is bool else p.add_argument(name, type=typ)
    return {k.replace("_", "-"): v for k, v in vars(p.parse_args(args)).items() if v is not None}


# --------------------------------------------------------------------------- nanochat's own batch rule


def nanochat_scaling_params(depth: int, vocab: int = 32768) -> int:
    """base_train.py get_scaling_params at 92d63d4: the blocks' parameters (c_q, c_k, c_v, c_proj, c_fc, c_proj and,
    on every other layer ending with the last, a 12 → n_kv_head value-embedding gate) + lm_head (vocab padded to 64)."""
    d = -(-64 * depth // 128) * 128
    heads = d // 128
    ve = sum(1 for i in range(depth) if i % 2 == (depth - 1) % 2)
    return depth * 12 * d * d + ve * 12 * heads + -(-vocab // 64) * 64 * d


def nanochat_batch(depth: int) -> int:
    ratio = int(12.0 * nanochat_scaling_params(depth)) / (12.0 * nanochat_scaling_params(12))
    return 2 ** round(math.log2(2**19 * ratio**0.383))


@pytest.mark.parametrize("depth, batch", [(12, 2**19), (20, 2**20), (26, 2**20), (32, 2**21)])
def test_nanochat_plans_its_own_batch_and_the_export_lets_it_compute_it(depth: int, batch: int, tmp_path: Path,
                                                                        capsys) -> None:
    assert nanochat_batch(depth) == batch
    plan = make(tmp_path, capsys, "--trainer", "nanochat", "--depth", str(depth), "--gpu", "8xH100", "--budget", "100")
    assert plan.training.total_batch_tokens == plan.schedule.tokens_per_step == batch
    t = plan.training
    assert t.device_batch_size * t.grad_accum_steps * 8 * 2048 == batch
    got = base_train_flags(tmp_path, capsys)
    assert "total-batch-size" not in got          # its default, -1: nanochat computes the same number (and LR, WD)
    assert got["device-batch-size"] == t.device_batch_size


def test_an_explicit_nanochat_batch_passes_through(tmp_path: Path, capsys) -> None:
    plan = make(tmp_path, capsys, "--trainer", "nanochat", "--depth", "20", "--gpu", "8xH100", "--budget", "100",
                "--total-batch-tokens", "524288")
    assert plan.training.total_batch_tokens == 524_288
    assert base_train_flags(tmp_path, capsys)["total-batch-size"] == 524_288
    code, out, _ = cli(["export", "plan.json", "--for", "nanochat"], capsys, tmp_path)
    assert "nanochat's own rule gives 1,048,576" in out


# --------------------------------------------------------------------------- FP8


def test_nanochat_fp8_is_planned_in_memory_and_speed_and_exported(tmp_path: Path, capsys) -> None:
    args = ("--trainer", "nanochat", "--depth", "20", "--gpu", "8xH100", "--budget", "100", "--device-batch-size", "16")
    bf16 = make(tmp_path, capsys, *args, name="bf16.json")
    fp8 = make(tmp_path, capsys, *args, "--fp8", name="fp8.json")
    assert fp8.request.fp8 and fp8.training.fp8 and base_train_flags(tmp_path, capsys, "fp8.json")["fp8"] is True
    assert base_train_flags(tmp_path, capsys, "bf16.json")["fp8"] is False
    # memory, as nanochat/fp8.py saves: per converted linear its fp8 input and weight (1 byte); q, k, v quantize the
    # same input three times, the MLP projection's fp8 input replaces the bf16 ReLU² output; the bf16 weight copies
    # (2 bytes) become fp8 (1 byte); the head's backward adds the fp8 gradient, its transposed copy and the weight's
    d, L, V, N = 1280, 20, 32768, 16 * 2048
    per_token = L * (3 * d + d + d + 4 * d - 2 * 4 * d) + d
    forward = per_token * N - L * 12 * d * d - V * d
    assert fp8.memory.phases["forward_end"] - bf16.memory.phases["forward_end"] == forward
    assert fp8.memory.phases["backward_start"] - bf16.memory.phases["backward_start"] == forward + 2 * N * V + V * d
    # speed: FP8 is counted against the FP8 peak (H100 SXM datasheet: 1,979 TFLOP/s dense) and runs faster
    assert fp8.throughput.peak_flops_per_gpu == 1979e12
    assert fp8.throughput.tokens_per_sec > 1.1 * bf16.throughput.tokens_per_sec


def test_with_nanochat_s_fp8_the_head_runs_in_fp8_too() -> None:
    """fp8_module_filter converts lm_head (d × padded vocab: both divide by 16, both ≥ 128): every matmul of the PaLM
    count runs at the FP8 rate; torchtitan's filter (and so the runner's assumption) keeps the head in bf16."""
    spec = nanochat_spec(20).model_copy(update={"vocab_size": 32768})
    prof = find_profile("H100-SXM")
    kw = dict(precision="bf16-autocast", compiled=True, ac=False, fp8=True)
    fp8_rate = matmul_rate(prof, "bf16-autocast", True)
    nanochat = compute_terms(spec, prof, **kw, variant=StepVariant(fp8_head=True))   # type: ignore[arg-type]
    assert nanochat.matmul == pytest.approx(6 * matmul_params(spec) / fp8_rate, rel=1e-12)
    runner = compute_terms(spec, prof, **kw)   # type: ignore[arg-type]
    assert runner.matmul > nanochat.matmul * 1.05


@pytest.mark.parametrize("args, why", [
    (["--gpu", "8xA100-80GB"], "A100-80GB is ampere"),
    (["--gpu", "8xL40S"], "L40S is ada"),
    (["--gpu", "8xH100", "--trainer-version", "2025-11"], "no --fp8"),
    (["--gpu", "8xH100", "--trainer", "torchtitan", "--preset", "8B"], "float8"),
    (["--preset", "d20"], "nanoplan's runner trains in bf16"),
])
def test_fp8_where_it_is_not_the_trainer_s_is_one_line(args: list[str], why: str, tmp_path: Path, capsys) -> None:
    trainer = [] if "--trainer" in args or "--preset" in args else ["--trainer", "nanochat", "--depth", "20"]
    code, _, err = cli(["estimate", *trainer, *args, "--fp8", "--budget", "100", "--out", "p.json"], capsys, tmp_path)
    line, _ = error_and_hint(err)
    assert code == 2 and line.startswith("error: --fp8:") and why in line, err
    assert not (tmp_path / "p.json").exists()


# --------------------------------------------------------------------------- windows follow the attention kernel


def windows(depth: int, pattern: str, T: int = 2048) -> list[int]:
    short = -(-T // 4 // 128) * 128          # gpt.py _compute_window_sizes
    w = [short if pattern[i % len(pattern)] == "S" else T for i in range(depth)]
    return w[:-1] + [T]


@pytest.mark.parametrize("gpu, pattern", [("8xH100", "SSSL"), ("8xH200", "SSSL"), ("8xA100-80GB", "L"),
                                          ("8xB200", "L"), ("1xRTX-4090", "L")])
def test_the_window_pattern_follows_the_attention_kernel(gpu: str, pattern: str, tmp_path: Path, capsys) -> None:
    plan = make(tmp_path, capsys, "--trainer", "nanochat", "--depth", "12", "--gpu", gpu, "--budget", "20",
                "--headroom", "0")
    assert base_train_flags(tmp_path, capsys)["window-pattern"] == pattern
    heads, hd = 6, 128
    attn = sum(12 * heads * hd * w for w in windows(12, pattern))        # gpt.py estimate_flops
    assert plan.model.flops_per_token == 6 * plan.model.matmul_params + attn


def test_sliding_windows_shorten_the_attention_time_by_the_keys_they_attend() -> None:
    spec = nanochat_spec(20).model_copy(update={"vocab_size": 32768})
    prof = find_profile("H100-SXM")
    T = spec.seq_len
    w = windows(20, "SSSL")
    kw = dict(precision="bf16-autocast", compiled=True, ac=False)
    from planner.kernels import StepSoftware
    from planner.plan import TrainerRef
    from planner.trainers.nanochat import NANOCHAT

    ref = TrainerRef(name="nanochat", version="2026-07", window_pattern="SSSL")
    software = NANOCHAT.step_software(spec, ref, prof)          # what a nanochat plan on H100 runs
    assert software.attention == "fa3"
    sssl = compute_terms(spec, prof, **kw, variant=StepVariant(attention_keys=tuple(w)),   # type: ignore[arg-type]
                         software=software)
    full = compute_terms(spec, prof, **kw, software=StepSoftware(attention="fa3"))   # type: ignore[arg-type]
    attended = sum(sum(min(t + 1, x) for t in range(T)) for x in w)     # query t attends min(t + 1, w) keys
    causal = 20 * sum(t + 1 for t in range(T))
    assert sssl.attention / full.attention == pytest.approx(attended / causal, rel=2e-3)
    assert sssl.matmul == full.matmul and sssl.elementwise == full.elementwise


def test_an_sssl_pattern_where_sdpa_runs_is_refused_by_validate(tmp_path: Path, capsys) -> None:
    make(tmp_path, capsys, "--trainer", "nanochat", "--depth", "12", "--gpu", "8xA100-80GB", "--budget", "20")
    doc = (tmp_path / "plan.json").read_text().replace('"window_pattern": "L"', '"window_pattern": "SSSL"')
    (tmp_path / "edited.json").write_text(doc)
    code, out, _ = cli(["validate", "edited.json"], capsys, tmp_path)
    assert code != 0 and "SDPA" in " ".join(out.split())


# --------------------------------------------------------------------------- evaluation passes


@pytest.mark.parametrize("gpu, budget", [("8xH100", "30"), ("1xRTX-3090", "30"), ("8xH100", "2")])   # $2: 46 s trains
def test_the_export_bounds_nanochat_s_evaluation_to_the_plan(gpu: str, budget: str, tmp_path: Path, capsys) -> None:
    plan = make(tmp_path, capsys, "--trainer", "nanochat", "--depth", "12", "--gpu", gpu, "--budget", budget)
    got = base_train_flags(tmp_path, capsys)
    every, steps, t = plan.schedule.checkpoint_every_steps, plan.schedule.total_steps, plan.training
    assert got["core-metric-every"] == -1 and got["sample-every"] == -1     # base_train: -1 disables them
    assert got["eval-every"] == got["save-every"] == every
    world = t.device_batch_size * t.seq_len * plan.hardware.num_gpus
    tokens = got["eval-tokens"]
    assert isinstance(tokens, int) and tokens % world == 0 and world <= tokens <= 80 * 524_288
    # base_train evaluates at step 0, every `every` steps and at the last; a forward pass is a third of a step's
    # FLOPs per token: all the passes take at most 1% of the training time
    passes = len({0, steps} | set(range(0, steps, every)))
    assert passes * tokens / 3 <= 0.01 * steps * t.total_batch_tokens or tokens == world
    _, out, _ = cli(["export", "plan.json", "--for", "nanochat"], capsys, tmp_path)
    assert f"({passes} passes) over {tokens:,} tokens each" in out


# --------------------------------------------------------------------------- torchtitan main


def test_torchtitan_main_takes_token_based_flags(tmp_path: Path, capsys) -> None:
    from torch.distributed.run import get_args_parser

    plan = make(tmp_path, capsys, "--trainer", "torchtitan", "--trainer-version", "main", "--preset", "8B", "--gpu",
                "8xH100", "--device-batch-size", "1", "--total-batch-tokens", str(16 * 8192), "--keep-last", "1",
                "--budget", "1000")
    code, out, err = cli(["export", "plan.json", "--for", "torchtitan"], capsys, tmp_path)
    assert code == 0, err
    line = [x for x in out.splitlines() if "torchtitan.train" in x][-1]
    run = get_args_parser().parse_args(shlex.split(line)[2:])
    p = argparse.ArgumentParser(exit_on_error=False)
    for name, typ in TORCHTITAN_MAIN_FLAGS.items():
        if typ is bool:
            p.add_argument(name, action="store_true")
        elif isinstance(typ, list):
            p.add_argument(name, type=typ[0], nargs=len(typ))
        else:
            p.add_argument(name, type=typ)
    p.add_argument("ac", choices=TORCHTITAN_MAIN_AC)
    cfg = vars(p.parse_args(run.training_script_args))
    t, s = plan.training, plan.schedule
    assert cfg["training.num_tokens_per_microbatch_per_dp_rank"] == t.device_batch_size * 8192
    assert cfg["training.num_tokens_per_train_step"] == s.tokens_per_step == 16 * 8192
    assert cfg["training.max_context_length"] == 8192 and cfg["training.steps"] == s.total_steps
    assert cfg["checkpoint.keep_latest_k"] == 2 and cfg["training.disable_cuda_graphs"]
    assert cfg["lr_scheduler.warmup_steps"] == plan.request.hyper.warmup_steps
    assert cfg["optimizer.param_groups.0.optimizer_kwargs.weight_decay"] == plan.request.hyper.weight_decay
    assert "b5bcd76c66d0" in out and "--training.local-batch-size" not in out


# --------------------------------------------------------------------------- DeepSpeed: its version and its words


def test_deepspeed_and_torchtitan_versions_are_the_releases_the_checks_run() -> None:
    from importlib.metadata import version

    from planner.trainers.deepspeed import DEEPSPEED
    from planner.trainers.torchtitan import TORCHTITAN

    ds, tt = DEEPSPEED.version(None), TORCHTITAN.version("0.3")
    assert ds.ref == f"deepspeed=={version('deepspeed')}" == "deepspeed==0.19.8"
    assert tt.ref == f"torchtitan=={version('torchtitan')}" == "torchtitan==0.3.0"
    assert (ds.date, tt.date) == ("2026-10-20", "2026-09-03")   # the package index's upload times
    assert "edaa722" not in ds.source                           # 0.19.6 development code, not 0.19.8


def test_deepspeed_plans_say_zero_3(tmp_path: Path, capsys) -> None:
    code, out, err = cli(["estimate", "--trainer", "deepspeed", "--preset", "gpt2", "--gpu", "8xH100", "--steps", "100",
                          "--strategy", "zero3", "--out", "plan.json"], capsys, tmp_path)
    assert code == 0, err
    assert "ZeRO-3" in out and "fsdp" not in out
    assert load_plan(tmp_path / "plan.json").request.strategy == "fsdp"
    code, out, err = cli(["export", "plan.json", "--for", "deepspeed"], capsys, tmp_path)
    assert code == 0 and "# ZeRO-3 (zero_optimization.stage 3)" in out and "fsdp" not in out
    notes = [x for x in err.splitlines() if x.startswith("note: ")]
    assert any("weight decay 0 and 0 warmup steps" in x and "the plan's" in x for x in notes), err
