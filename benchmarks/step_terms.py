"""Print the step-time model's terms for one model across micro-batches (planner.throughput; no torch).

Usage: python benchmarks/step_terms.py [--gpu 8xH100] [--depth 26] [--strategy ddp] [--optimizer adamw]
                                       [--loss-chunk-tokens 4096] [--total-batch-tokens 524288]
       python benchmarks/step_terms.py --sizes      (the default MFU by model size, per GPU profile)
Every micro-batch that divides the per-GPU batch is shown, whether or not it fits in memory
(docs/throughput.md explains each column).
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="8xH100")
    ap.add_argument("--depth", type=int, default=26)
    ap.add_argument("--strategy", default="ddp", choices=["ddp", "zero1", "zero2", "fsdp"])
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "muon"])
    ap.add_argument("--loss-chunk-tokens", type=int, default=4096)
    ap.add_argument("--total-batch-tokens", type=int, default=524_288)
    ap.add_argument("--sizes", action="store_true", help="print the default MFU of nanochat depths per profile")
    a = ap.parse_args()
    if a.sizes:
        sizes()
        return

    from planner.build import batch_choices
    from planner.memory_terms import StepConfig
    from planner.profiles import parse_gpu_spec
    from planner.spec import nanochat
    from planner.throughput import estimate_throughput

    hw = parse_gpu_spec(a.gpu)
    spec = nanochat(a.depth)
    g = hw.num_gpus
    print(f"{spec.name} on {hw.spec}, {a.strategy}, {a.optimizer}, loss chunk {a.loss_chunk_tokens}, "
          f"{a.total_batch_tokens:,} tokens/step (times in ms per optimizer step)")
    print(f"{'b×acc':>7} {'compute':>9} {'of which loss recompute':>24} {'optimizer':>10} {'micro-steps':>12} "
          f"{'exposed comm':>13} {'step':>9} {'tokens/s':>10} {'MFU':>5}")
    for b in sorted(batch_choices(a.total_batch_tokens, spec.seq_len, g)):
        acc = a.total_batch_tokens // (b * spec.seq_len * g)
        tp = estimate_throughput(StepConfig(spec=spec, device_batch_size=b, grad_accum_steps=acc, dp=g,
                                            strategy=a.strategy, optimizer=a.optimizer,  # type: ignore[arg-type]
                                            loss_chunk_tokens=a.loss_chunk_tokens), hw)
        ms = [x * 1000 for x in (tp.compute_seconds, tp.loss_recompute_seconds, tp.optimizer_seconds,
                                 tp.micro_step_seconds, tp.exposed_comm_seconds, tp.step_seconds)]
        print(f"{f'{b}×{acc}':>7} {ms[0]:9.1f} {ms[1]:24.1f} {ms[2]:10.1f} {ms[3]:12.1f} {ms[4]:13.1f} {ms[5]:9.1f} "
              f"{tp.tokens_per_sec:10,.0f} {tp.mfu:5.1%}")


def sizes() -> None:
    from planner.counts import n_params
    from planner.profiles import builtin_profiles, size_factor
    from planner.spec import nanochat

    gpus = [p for p in builtin_profiles().values() if p.kind == "gpu"]
    print(f"{'model':>5} {'params':>14} {'factor':>6} " + " ".join(f"{p.name:>10}" for p in gpus))
    for d in (2, 4, 8, 12, 16, 20, 26, 32, 48, 64):
        n = n_params(nanochat(d))
        print(f"{'d' + str(d):>5} {n:>14,} {size_factor(n):6.3f} " + " ".join(f"{p.mfu_for(n):10.1%}" for p in gpus))


if __name__ == "__main__":
    main()
