"""nanochat's pre-training step (karpathy/nanochat `scripts/base_train.py`), as nanoplan plans it.

Versions (each a commit of karpathy/nanochat; `--trainer-version KEY`):

- 2025-10, the first release (3a5e0bc, 2025-10-13). `scripts/base_train.py`, `nanochat/gpt.py`,
  `nanochat/muon.py` and `nanochat/adamw.py` are byte-identical at 67aaca9 and fae3aca, where the
  public d20 and d32 memory reports were made (benchmarks/public_runs/runs.yaml). Flags go through
  the configurator (`--device_batch_size=32`); it checkpoints only at the end of the run.
- 2025-11 (c6abcdf, 2025-11-13): the same step, plus `--save_every` and `--resume_from_step`.
- 2026-07, the current one (92d63d4, 2026-07-03, still nanochat's newest commit on 2026-11-27): argparse flags
  with dashes, value embeddings on alternate layers, per-layer residual scalars, sliding-window attention (SSSL),
  no autocast (weights cast per matmul), one MuonAdamW optimizer, a 32,768 token vocabulary padded to a multiple
  of 64. Its recipe, as base_train.py sets it by itself: the total batch from the depth (`auto_total_batch`; the
  export leaves `--total-batch-size` out when the plan's batch is that one), `--fp8` on H100 or newer (`fp8_bytes`,
  `step_variant`), the window pattern the attention kernel supports (`window_pattern_for`: SSSL under Flash
  Attention 3 on Hopper, L under SDPA elsewhere), and expandable_segments (`allocator_sets`: the fit verdict's advice).

What the step does, and where it says so (paths at the version's commit):
- model: d_model = 64·depth (2026-07: rounded up to a multiple of head_dim 128), head_dim 128,
  n_kv_head = n_head, untied, weightless RMSNorm, ReLU², rotary, QK-norm, softcap 15
  (gpt.py; base_train.py). The token embedding is cast to bf16 ("it saves memory", gpt.py `GPT.__init__`;
  2026-07 also the value embeddings, `init_weights`); every other weight is fp32.
- step: `torch.compile(model, dynamic=False)` over forward and loss (base_train.py); bf16 autocast
  (2025); the loss is cross-entropy over the full (B·T, V) logits, no chunking ("TODO: experiment
  with Liger Kernels / chunked cross-entropy", gpt.py `forward`); no activation checkpointing; no
  DDP wrapper: gradients stay whole on every rank and the optimizers reduce them.
- optimizer: Muon for the block matrices and AdamW for embedding and head (gpt.py `setup_optimizers`).
  On several GPUs DistAdamW keeps exp_avg/exp_avg_sq for 1/world of each tensor's rows, "in the style
  of ZeRO-2" (adamw.py), and DistMuon keeps a momentum buffer only on the rank that owns a matrix,
  matrices of a shape dealt round-robin, plus one zero buffer per shape (muon.py). On one GPU:
  torch.optim.AdamW(fused=True) and Muon with full state. 2026-07: MuonAdamW (optim.py) shards the same
  way, adds a factored second-moment buffer, and stacks each shape's gradients for reduce_scatter.
- the compiled backward reuses the saved logits' buffer for their gradient (AOTAutograd's donated
  buffers, torch._functorch.config.donated_buffer), so the loss adds no logit-sized buffer. Measured:
  d20 at B32 on 8xH100 peaks at 75,422 MiB allocated, the saved tensors plus the state
  (tests/test_trainers.py holds the model to it; docs/trainers.md).

The saved tensors are the planner's compiled-step counts (planner/memory_compiled.py, captured from
AOTAutograd's partitioner on CPU: 40.1 bytes per token per d_model per block, the same for nanochat's
block, docs/sources.md §7) with the unchunked loss. The 2026-07 model adds its value embeddings,
residual scalars and bf16 norms to them: an estimate no public measurement checks yet.
"""

from __future__ import annotations

import math
from typing import Any

from planner.compute_model import StepVariant
from planner.counts import attn_weight_params, mlp_weight_params
from planner.kernels import StepSoftware, window_span
from planner.memory import BREAKDOWN_KEYS
from planner.memory_backward import block_bw
from planner.memory_compiled import saved_parts
from planner.memory_terms import F32, I64, Dims, MemoryEstimate, StepConfig, Walk, block_weights, model_bytes
from planner.plan import Plan, PlanRequest, TrainerRef
from planner.profiles import HardwareProfile
from planner.spec import ModelSpec
from planner.trainers import Checkout, Counts, Trainer, Version, with_overheads
from planner.units import fmt_count

BF16 = 2
REPO = "karpathy/nanochat"
FIRST, NOV, CURRENT = "2025-10", "2025-11", "2026-07"
VERSIONS = (
    Version(FIRST, "3a5e0bc50b123f37220f1ace6813f080455d19f3", "2025-10-13", "first release",
            f"{REPO} scripts/base_train.py, nanochat/gpt.py, nanochat/muon.py, nanochat/adamw.py"),
    Version(NOV, "c6abcdfe3a23f3cc3656e4132a606e8753415fca", "2025-11-13", "first with --save_every",
            f"{REPO} scripts/base_train.py, nanochat/gpt.py"),
    Version(CURRENT, "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd", "2026-07-03", "current, argparse",
            f"{REPO} scripts/base_train.py, nanochat/gpt.py, nanochat/optim.py"),
)
DEFAULT_VOCAB = {FIRST: 65536, NOV: 65536, CURRENT: 32768}   # scripts/tok_train.py default --vocab_size/--vocab-size
ROTARY_OVERCOMPUTE = 10      # gpt.py: self.rotary_seq_len = config.sequence_len * 10 (bf16 cos and sin buffers)
VOCAB_PAD = 64               # 2026-07 gpt.py: GPT(pad_vocab_size_to=64)
VE_GATE_CHANNELS = 12        # 2026-07 gpt.py: self.ve_gate_channels = 12
SMEAR_CHANNELS = 24          # 2026-07 gpt.py: self.smear_gate = Linear(24, 1)
SMALL_ADAMW = 1024           # 2026-07 optim.py: params with numel < 1024 are all-reduced, not sharded
# 2026-07 base_train.py, the total batch when --total-batch-size is -1 (its default): B_REF at d12, scaled by the
# horizon's ratio to d12's to the power 0.383 (Power Lines, arXiv 2505.13738), rounded to a power of two; the horizon
# is --target-param-data-ratio (default 12) × the scaling parameters (transformer matrices + lm_head)
B_REF = 2**19
BATCH_EXPONENT = 0.383
DATA_RATIO = 12.0
REF_DEPTH = 12
FP8_ARCHITECTURES = ("hopper", "blackwell")   # base_train.py --fp8: "enable FP8 training (requires H100+ GPU)"
FA3_ARCHITECTURES = ("hopper",)     # flash_attention.py loads varunneal/flash-attention-3 for sm90 unconditionally


def model_spec(version: str, depth: int, seq_len: int = 2048, vocab_size: int | None = None) -> ModelSpec:
    """The model base_train.py builds for --depth at this version (dims as ModelSpec, vocab unpadded).

    2025: model_dim = 64·depth, num_heads = ceil(model_dim/128) (gpt.py asserts it divides model_dim;
    where it does not, the next divisor stands in and `problems` refuses the depth). 2026-07:
    model_dim rounded up to a multiple of head_dim 128 (base_train.py build_model_meta)."""
    base = 64 * depth
    if version == CURRENT:
        d = math.ceil(base / 128) * 128
        h = d // 128
    else:
        d = base
        h = _divisor(d, max(1, (base + 127) // 128))
    return ModelSpec(style="nanochat", n_layer=depth, d_model=d, n_head=h, n_kv_head=h, d_ff=4 * d,
                     vocab_size=vocab_size or DEFAULT_VOCAB[version], seq_len=seq_len, mlp="relu2",
                     norm="rmsnorm_noweight", pos="rotary", tied=False, bias=False, qk_norm=True, logit_softcap=15.0)


def _divisor(d: int, h: int) -> int:
    while d % h:
        h += 1
    return h


def _padded(v: int, version: str) -> int:
    return math.ceil(v / VOCAB_PAD) * VOCAB_PAD if version == CURRENT else v


def ve_layers(n_layer: int) -> int:
    """2026-07 gpt.py has_ve: layers i with i % 2 == (n_layer - 1) % 2 carry a value embedding."""
    return sum(1 for i in range(n_layer) if i % 2 == (n_layer - 1) % 2)


def attention_kernel(profile: HardwareProfile) -> str:
    """"fa3" or "sdpa": the attention 2026-07 runs on this GPU. nanochat/flash_attention.py loads Flash Attention 3
    from the kernels hub: varunneal/flash-attention-3 on Hopper (sm90), with bf16 compute (every CUDA GPU from sm80);
    on Ampere and Ada only if the hub has a kernels-community/flash-attn3 build for the installed torch (unknowable
    when planning, so not counted on); on Blackwell, a CPU or anything else, PyTorch's SDPA."""
    arch = profile.speed.architecture if profile.kind == "gpu" and profile.speed is not None else ""
    return "fa3" if arch in FA3_ARCHITECTURES else "sdpa"


def window_pattern_for(profile: HardwareProfile) -> str:
    """The --window-pattern the export passes: its default SSSL under FA3; L under SDPA, which has no sliding windows
    (base_train.py then warns "Your GPU utilization will be terrible" and recommends --window-pattern L)."""
    return "SSSL" if attention_kernel(profile) == "fa3" else "L"


def scaling_params(spec: ModelSpec, version: str) -> int:
    """base_train.py get_scaling_params: transformer matrices (every parameter of the blocks, value-embedding gates
    included) + lm_head (padded vocabulary × d_model)."""
    c = NANOCHAT.counts(spec, TrainerRef(name="nanochat", version=version))
    return c.by_group["attention"] + c.by_group["mlp"] + c.by_group["head"]


def auto_total_batch(spec: ModelSpec, version: str) -> int | None:
    """The total batch 2026-07 picks itself (--total-batch-size -1, its default): 2**round(log2(B_REF × (D/D_ref)^0.383))
    with D = 12 × scaling parameters and D_ref the same for d12 at this vocabulary; None for 2025 versions (524,288)."""
    if version != CURRENT:
        return None
    target = int(DATA_RATIO * scaling_params(spec, version))
    d_ref = DATA_RATIO * scaling_params(model_spec(version, REF_DEPTH, spec.seq_len, spec.vocab_size), version)
    return int(2 ** round(math.log2(B_REF * (target / d_ref) ** BATCH_EXPONENT)))


def _matrix_shapes(spec: ModelSpec) -> list[tuple[tuple[int, int], int]]:
    """(shape, count) of the block matrices Muon optimises: c_q, c_k, c_v, c_proj, c_fc, mlp.c_proj."""
    d, q, kv, f, L = spec.d_model, spec.n_head * spec.head_dim, spec.n_kv_head * spec.head_dim, spec.d_ff, spec.n_layer
    shapes: dict[tuple[int, int], int] = {}
    for shp in ((q, d), (kv, d), (kv, d), (d, q), (f, d), (d, f)):
        shapes[shp] = shapes.get(shp, 0) + L
    return list(shapes.items())


# a cluster node's data for a plan (planner/export_node.py), as runs/speedrun.sh at 00a562cf fetches it
SHARDS_PER_B_TOKENS = 35                  # "Approximately 350 shards are needed for 10B tokens of data"
MIN_SHARDS = 8                            # its tokenizer trains on the first 8 shards (~2B characters)
MAX_SHARDS = 1822                         # "The maximum total number of shards available in the entire dataset"
SHARD_MARGIN = 1.1                        # 10% more than the plan's tokens: the loader crops some


class Nanochat(Trainer):
    name = "nanochat"
    repo = REPO
    versions = VERSIONS
    default_version = CURRENT
    # os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True" before importing torch (PYTORCH_ALLOC_CONF
    # from 50413d2 on): scripts/base_train.py line 12 at 3a5e0bc, line 15 at c6abcdf and 92d63d4
    allocator_sets = "scripts/base_train.py, before importing torch"
    model_hint = "give --depth N"
    no_fit_note = ("nanochat keeps whole fp32 weights and gradients on every GPU (only the optimizer state is "
                   "sharded) and has no activation checkpointing, so a smaller micro-batch cannot help.")

    # ---------------------------------------------------------------- its models

    def model_for(self, version: str, *, depth: int | None, preset: str | None, seq_len: int | None,
                  vocab: int | None) -> ModelSpec | None:
        """--depth N: nanochat's own model of that depth (model_spec)."""
        if depth is None or depth <= 0:
            return None
        return model_spec(version, depth, seq_len or 2048, vocab)

    def smaller_models(self, spec: ModelSpec, version: str) -> list[tuple[str, ModelSpec]]:
        """The even depths below the plan's, deepest first (nanochat's depth ladder)."""
        return [(f"d{d} (--depth {d})", model_spec(version, d, spec.seq_len, spec.vocab_size))
                for d in range(spec.n_layer - 2 + spec.n_layer % 2, 0, -2)]

    # ---------------------------------------------------------------- what it can express

    def problems(self, req: PlanRequest, num_gpus: int, nodes: int, gpu_kind: str) -> list[tuple[str, str, str]]:
        v = self.version(req.trainer.version).key
        spec = req.model
        out: list[tuple[str, str, str]] = []
        if gpu_kind == "cpu" and num_gpus > 1:   # runs/runcpu.sh: one `python -m scripts.base_train --device-type=cpu`
            out.append(("--gpu", f"on a CPU it sets up no process group (nanochat/common.py compute_init joins one only "
                        f"on CUDA), so {num_gpus} processes would train {num_gpus} unsynchronised copies",
                        "use --gpu CPU (one process)"))
        if nodes > 1:
            out.append(("--gpu", "its launch is one node (`torchrun --standalone`, speedrun.sh)", "use one node"))
        want = model_spec(v, spec.n_layer, spec.seq_len, spec.vocab_size)
        if spec.style != "nanochat" or spec.model_dump(exclude={"style"}) != want.model_dump(exclude={"style"}):
            out.append(("--depth", "base_train.py builds only its depth-parameterised GPT (d_model = 64·depth, head_dim "
                        "128, ReLU², untied, QK-norm, softcap 15)", "give --depth N (and --seq-len, --vocab-size)"))
        elif v != CURRENT and spec.d_model % ((spec.d_model + 127) // 128):
            out.append(("--depth", f"depth {spec.n_layer} gives n_head = ceil({spec.d_model}/128), which does not divide "
                        f"{spec.d_model} (gpt.py asserts it)", "use an even depth, or --trainer-version 2026-07"))
        if req.optimizer != "muon":
            out.append(("--optimizer", "it trains the block matrices with Muon and embedding/head with AdamW; it has "
                        "no AdamW-only mode", "drop --optimizer (nanochat implies muon)"))
        want_strategy = "zero1" if num_gpus > 1 else "ddp"
        if req.strategy != want_strategy:
            out.append(("--strategy", "its only sharding is DistMuon/DistAdamW (optimizer state over ranks, whole "
                        "gradients and weights): zero1 in nanoplan's terms", "drop --strategy"))
        if req.activation_checkpointing:
            out.append(("--activation-checkpointing", "base_train.py has no activation checkpointing",
                        "drop it, or lower the micro-batch"))
        if not req.compile:
            out.append(("--no-compile", "base_train.py always runs torch.compile(model)", "drop --no-compile"))
        if gpu_kind == "cpu" and req.precision != "fp32":
            out.append(("--precision", "on a CPU it computes in fp32 (nanochat/common.py: COMPUTE_DTYPE without CUDA)",
                        "add --precision fp32"))
        elif gpu_kind != "cpu" and req.precision != "bf16-autocast":
            out.append(("--precision", "it trains fp32 weights with bf16 matmuls (and a bf16 embedding)",
                        "drop --precision"))
        if req.loss_chunk_tokens != 0:
            out.append(("loss_chunk_tokens", "its loss takes the full logits in one piece", "set it to 0"))
        if req.trainer.ac_mode is not None:
            out.append(("--ac-mode", "is a torchtitan option", "drop it"))
        out += self._recipe_problems(req, v)
        return out

    def _recipe_problems(self, req: PlanRequest, v: str) -> list[tuple[str, str, str]]:
        """FP8 and the window pattern (2026-07 only)."""
        out: list[tuple[str, str, str]] = []
        arch = req.profile.speed.architecture if req.profile.kind == "gpu" and req.profile.speed is not None else "cpu"
        if req.fp8 and v != CURRENT:
            out.append(("--fp8", f"nanochat {v} has no --fp8 (it came on 2026-02-03, 6079f78)",
                        "use --trainer-version 2026-07, or drop --fp8"))
        elif req.fp8 and arch not in FP8_ARCHITECTURES:
            out.append(("--fp8", f"its FP8 needs an H100 or newer (base_train.py: \"requires H100+ GPU\"); "
                        f"{req.profile.name} is {arch}", "drop --fp8, or plan an H100, H200 or B200"))
        pattern = req.trainer.window_pattern
        if v != CURRENT and pattern is not None:
            out.append(("window_pattern", f"nanochat {v} has no sliding windows", "leave it unset"))
        elif v == CURRENT and pattern != "L" and attention_kernel(req.profile) == "sdpa":
            out.append(("window_pattern", f"{pattern or 'SSSL'} on {req.profile.name}, where nanochat runs PyTorch's "
                        "SDPA (no Flash Attention 3), which has no sliding windows: base_train.py recommends "
                        "--window-pattern L", "re-plan it with nanoplan estimate (it picks L off Hopper)"))
        return out

    def request_fields(self, user: dict[str, Any], num_gpus: int, version: str | None,
                       profile: HardwareProfile | None = None) -> dict[str, Any]:
        v = self.version(version).key
        pattern = window_pattern_for(profile) if v == CURRENT and profile is not None else None
        return {"optimizer": user.get("optimizer") or "muon",
                "strategy": user.get("strategy") or ("zero1" if num_gpus > 1 else "ddp"),
                "activation_checkpointing": bool(user.get("activation_checkpointing")),
                "compile": user.get("compile") is not False, "precision": user.get("precision") or "bf16-autocast",
                "loss_chunk_tokens": 0, "trainer": TrainerRef(name="nanochat", version=v, ac_mode=user.get("ac_mode"),
                                                              window_pattern=pattern)}   # type: ignore[arg-type]

    def default_total_batch(self, spec: ModelSpec, version: str | None) -> int | None:
        return auto_total_batch(spec, self.version(version).key)

    def step_variant(self, req: PlanRequest) -> StepVariant | None:
        """2026-07: its sliding windows; with --fp8 the lm_head runs in FP8 too (base_train.py's fp8_module_filter
        converts every nn.Linear whose dims divide by 16 and are at least 128: the six block matrices and lm_head,
        not the value-embedding gates nor the smear gate). Every version: its matmul time is the fitted
        `nanochat_matmul` share of the model's (planner/speed_constants.py)."""
        v = self.version(req.trainer.version).key
        if v != CURRENT:
            return StepVariant(matmul_constant="nanochat_matmul")
        return StepVariant(attention_keys=tuple(window_sizes(req.model, req.trainer.window_pattern or "SSSL")),
                           fp8_head=True, matmul_constant="nanochat_matmul")

    # ---------------------------------------------------------------- speed (issue 29)

    def step_software(self, spec: ModelSpec, ref: TrainerRef, prof: HardwareProfile) -> StepSoftware:
        """The attention nanochat runs (planner/kernels.py). 2025 versions: SDPA with is_causal under torch 2.8.0
        (pyproject.toml): FlashAttention-2. 2026-07: nanochat/flash_attention.py loads FlashAttention-3 through
        `kernels` (varunneal/flash-attention-3 on Hopper; kernels-community/flash-attn3 for Ampere and Ada only when
        the hub has a build for the installed torch, not counted on: `attention_kernel`) and runs the plan's sliding
        windows in it; elsewhere SDPA, whose windowed layers pass an explicit mask and so attend to the whole sequence
        (span 2 against causal), the long ones is_causal (the export picks L there: `window_pattern_for`)."""
        if self.version(ref.version).key != CURRENT:
            return StepSoftware(attention="fa2")
        windows = window_sizes(spec, ref.window_pattern or window_pattern_for(prof))   # the plan's --window-pattern
        if attention_kernel(prof) == "sdpa":   # windowed layers pass an explicit mask: the whole sequence (span 2)
            span = sum(1.0 if w >= spec.seq_len else 2.0 for w in windows) / len(windows)
            return StepSoftware(attention="fa2", attention_span=span)
        return StepSoftware(attention="fa3", attention_span=window_span(windows, spec.seq_len))

    # ---------------------------------------------------------------- counts

    def counts(self, spec: ModelSpec, ref: TrainerRef) -> Counts:
        v = self.version(ref.version).key
        d, L = spec.d_model, spec.n_layer
        V = _padded(spec.vocab_size, v)
        kv = spec.n_kv_head * spec.head_dim
        attn = L * attn_weight_params(spec)
        mlp = L * mlp_weight_params(spec)
        groups = {"embeddings": V * d, "attention": attn, "mlp": mlp, "norms": 0, "head": V * d}
        if v == CURRENT:
            n_ve = ve_layers(L)
            groups["value_embeddings"] = n_ve * V * kv
            groups["attention"] += n_ve * VE_GATE_CHANNELS * spec.n_kv_head
            groups["scalars"] = 2 * L + SMEAR_CHANNELS + 2
        n = sum(groups.values())
        matmul = attn + mlp + V * d + (ve_layers(L) * VE_GATE_CHANNELS * spec.n_kv_head + SMEAR_CHANNELS
                                       if v == CURRENT else 0)
        windows = window_sizes(spec, ref.window_pattern or "SSSL") if v == CURRENT else [spec.seq_len] * L
        attn_flops = sum(12 * spec.n_head * spec.head_dim * w for w in windows)
        return Counts(n_params=n, by_group={**groups, "total": n}, matmul_params=matmul,
                      flops_per_token=6 * matmul + attn_flops)

    def ratio_params(self, spec: ModelSpec, ref: TrainerRef) -> tuple[int, str]:
        """The parameters nanochat's data:param ratio counts. 2025-10/11: every parameter (`num_params =
        sum(p.numel() for p in model.parameters())`); 2026-07 (92d63d4): its "scaling params", transformer matrices
        + lm_head (scripts/base_train.py `get_scaling_params`, lines 263-269: "transformer matrices + lm_head gives
        cleanest scaling laws"), which leaves out the token and value embeddings (419M of d20's 897M)."""
        if self.version(ref.version).key != CURRENT:
            return super().ratio_params(spec, ref)
        return scaling_params(spec, CURRENT), "scaling param"   # transformer.h (ve gates included) + lm_head

    def default_steps(self, spec: ModelSpec, ref: TrainerRef, tokens_per_step: int) -> tuple[int, str]:
        """base_train.py's own length when given none: --target-param-data-ratio × the parameters it counts
        (2025-10/11: 20, 2026-07: 12), then `target_tokens // total_batch_size` steps."""
        if self.version(ref.version).key != CURRENT:
            return super().default_steps(spec, ref, tokens_per_step)
        n, _ = self.ratio_params(spec, ref)
        return (max(1, int(DATA_RATIO * n) // tokens_per_step),
                f"nanochat's own default, {DATA_RATIO:g} tokens per scaling param (its transformer matrices + "
                f"lm_head, {fmt_count(n)} of {fmt_count(self.counts(spec, ref).n_params)} params; base_train.py "
                f"--target-param-data-ratio {DATA_RATIO:g})")

    # ---------------------------------------------------------------- memory

    def memory(self, cfg: StepConfig, ref: TrainerRef, overheads: dict[str, int], fragmentation: float) -> MemoryEstimate:
        v = self.version(ref.version).key
        phases = step_phases(cfg, v)
        name, kinds = max(phases.items(), key=lambda kv: sum(kv[1].values()))
        totals = {p: sum(k.values()) for p, k in phases.items()}
        # base_train.py sets expandable_segments:True before importing torch (PYTORCH_CUDA_ALLOC_CONF in 2025,
        # PYTORCH_ALLOC_CONF at 92d63d4): the allocator grows segments in place instead of splitting fixed ones, so
        # the profile's fragmentation allowance is not added to its total here; the fit verdict's margin (measured on
        # runs that set it too: planner/fit_verdict.py) still applies, and its advice says the trainer sets it.
        return with_overheads(totals[name], name, kinds, totals, overheads, 0.0)



    # ---------------------------------------------------------------- a cluster node (planner/export_node.py)

    # a checkout, not a package: its environment made with uv, as its runs/speedrun.sh makes it
    checkout = Checkout("NANOCHAT_DIR", "scripts/base_train.py", (
        "# its own environment, as its runs/speedrun.sh makes it",
        'command -v uv >/dev/null || { curl -LsSf https://astral.sh/uv/install.sh | sh; export PATH="$HOME/.local/bin:$PATH"; }',
        "[ -d .venv ] || uv venv",
        "uv sync --extra gpu",
    ), ".venv (uv sync --extra gpu) and data (python -m nanochat.dataset; its runs/speedrun.sh shows how)")

    def node_data_setup(self, plan: Plan) -> list[str]:
        """Its own data and tokenizer for the plan's tokens (base_train reads them from NANOCHAT_BASE_DIR)."""
        req = plan.request
        shards = math.ceil(plan.schedule.total_tokens / 1e9 * SHARDS_PER_B_TOKENS * SHARD_MARGIN)
        shards = min(MAX_SHARDS, max(MIN_SHARDS, shards))
        vocab = req.model.vocab_size
        tok = "" if vocab == DEFAULT_VOCAB.get(req.trainer.version or "", vocab) else f" --vocab-size={vocab}"
        return [f"# nanochat's data ({shards} shards for {plan.schedule.total_tokens / 1e9:.3g}B tokens) and tokenizer",
                f".venv/bin/python -m nanochat.dataset -n {shards}",
                f"[ -f \"${{NANOCHAT_BASE_DIR:-$HOME/.cache/nanochat}}/tokenizer/tokenizer.pkl\" ] || "
                f".venv/bin/python -m scripts.tok_train{tok}"]


NANOCHAT = Nanochat()


def window_sizes(spec: ModelSpec, pattern: str = "SSSL", short: int | None = None) -> list[int]:
    """2026-07 gpt.py _compute_window_sizes: the pattern tiled over the layers, S = ceil(T/4/128)·128 (or `short`:
    earlier commits' value, benchmarks/public_runs), L = T, and the last layer always L."""
    T = spec.seq_len
    short = -(-T // 4 // 128) * 128 if short is None else short
    w = [short if pattern[i % len(pattern)] == "S" else T for i in range(spec.n_layer)]
    w[-1] = T
    return [min(x, T) for x in w]


# --------------------------------------------------------------------------- the step's bytes


def _state(spec: ModelSpec, v: str, dp: int) -> tuple[int, int, int, int, int]:
    """(parameters, gradients when all exist, optimizer state on the busiest rank, optimizer step
    temporaries, buffers), bytes. Embeddings (and 2026-07 value embeddings) are bf16, the rest fp32."""
    d, L = spec.d_model, spec.n_layer
    V = _padded(spec.vocab_size, v)
    kv = spec.n_kv_head * spec.head_dim
    mats = _matrix_shapes(spec)
    M = sum(r * c * n for (r, c), n in mats)
    emb = [(V * d, BF16, V)]                                    # wte: (numel, bytes, rows)
    if v == CURRENT:
        emb += [(V * kv, BF16, V)] * ve_layers(L)
    head = (V * d, F32, V)
    small = (ve_layers(L) * VE_GATE_CHANNELS * spec.n_kv_head + 2 * L + SMEAR_CHANNELS + 2) if v == CURRENT else 0
    params = F32 * M + sum(n * b for n, b, _ in emb) + head[0] * head[1] + F32 * small
    adam = [*emb, head]
    if dp > 1:   # DistAdamW / MuonAdamW: exp_avg + exp_avg_sq of 1/dp of the rows, in the param dtype
        opt = sum(2 * b * (rows // dp) * (n // rows) for n, b, rows in adam) + 2 * F32 * small
    else:        # fused AdamW: both moments whole
        opt = sum(2 * b * n for n, b, _ in adam) + 2 * F32 * small
    opt += 16 * len(adam)                                         # step counters
    temps = 0
    for (r, c), n in mats:
        own = math.ceil(n / dp)                                    # the busiest rank owns ceil(n/dp) of a shape
        mom = F32 * r * c * own
        if v == CURRENT:
            mom += F32 * own * (r if r >= c else c)                # factored second moment (optim.py)
            temps += F32 * r * c * (own * dp + own if dp > 1 else n)   # stacked grads (+ the owned chunk)
        elif dp > 1:
            mom += F32 * r * c                                     # DistMuon: one zero buffer per shape group
        opt += mom
    s_max = max(4 * r * c + 4 * min(r, c) ** 2 for (r, c), _ in mats)   # Newton-Schulz: bf16 X, A, B, update
    if dp > 1:
        temps += sum(b * (rows // dp) * (n // rows) for n, b, rows in adam)   # reduce-scattered grad slices
    temps += s_max
    rotary = 2 * ROTARY_OVERCOMPUTE * spec.seq_len * (spec.head_dim // 2) * BF16
    return params, params, opt, temps, rotary


def _extra_saved(spec: ModelSpec, v: str, N: int) -> int:
    """2026-07's saved tensors beyond the 2025 block (an estimate): per layer the residual before its
    scalars (bf16) but no bf16 casts of the norm outputs (norms run in bf16); per value-embedding layer its
    lookup and gate; the initial embedding x0 and the mid-stack residual kept for backout."""
    if v != CURRENT:
        return 0
    d, L = spec.d_model, spec.n_layer
    kv = spec.n_kv_head * spec.head_dim
    per_layer = BF16 * d - 2 * BF16 * d
    ve = ve_layers(L) * (BF16 * kv + F32 * spec.n_kv_head)
    return (L * per_layer + ve + 2 * BF16 * d) * N


def fp8_bytes(D: Dims, L: int, N: int) -> tuple[int, int, int, int]:
    """What --fp8 changes in the step's bytes (an estimate no public measurement checks yet), from nanochat/fp8.py at
    92d63d4: each converted linear's _Float8Matmul saves its input and its weight quantized to fp8 (1 byte each,
    ctx.save_for_backward), and its backward quantizes the output gradient (e5m2) and makes a transposed contiguous
    copy of it and a column-major copy of the fp8 weight. Against the bf16 step (planner.memory_compiled): the bf16
    weight copies (2 bytes) become fp8 ones (1 byte); q, k and v each save an fp8 copy of the same input; the bf16
    ReLU² output, kept only for the MLP projection's weight gradient, becomes its fp8 copy; the attention output and
    the norms' inputs stay (attention and the norms' backwards need them). Returns (blocks' saved bytes, the head's
    saved bytes, the head's backward temporaries, the largest block linear's backward temporaries)."""
    d, q, f, V, a = D.d, D.q, D.f, D.V, D.a
    per_token = (3 * d + q + d + f) - a * f                # fp8 inputs of q/k/v, attn proj, fc, MLP proj; no bf16 ReLU²
    blocks = L * per_token * N - L * (a - 1) * block_weights(D)
    head = d * N - (a - 1) * V * d                          # its fp8 input; the weight copy at 1 byte, not 2
    head_bw = 2 * N * V + V * d                             # grad fp8 + its transposed copy; the weight's copy
    block_bw_ = 2 * N * f + f * d                           # the same for the widest block linear (fc / MLP proj)
    return blocks, head, head_bw, block_bw_


def step_phases(cfg: StepConfig, v: str) -> dict[str, dict[str, int]]:
    """Each phase's bytes by kind, for nanochat's compiled step (module docstring)."""
    spec = cfg.spec
    mem_spec = spec.model_copy(update={"vocab_size": _padded(spec.vocab_size, v)})
    dp = max(1, cfg.dp)
    N = cfg.device_batch_size * spec.seq_len
    m = model_bytes(mem_spec, "bf16-autocast", "muon")
    D = m.D
    params, grads_all, opt, opt_temps, buffers = _state(mem_spec, v, dp)
    parts = saved_parts(m, N, False, 0)
    f8_blocks, f8_head, f8_head_bw, f8_block_bw = fp8_bytes(D, spec.n_layer, N) if cfg.fp8 else (0, 0, 0, 0)
    saved = sum(parts.values()) + _extra_saved(mem_spec, v, N) + f8_blocks + f8_head
    inputs = 2 * I64 * N
    accum = cfg.grad_accum_steps
    grads0 = grads_all if accum > 1 else 0                       # later micro-steps add into existing grads
    fixed = {"parameters": params, "buffers": buffers, "optimizer_state": opt}
    base = {**fixed, "gradients": grads0, "activations": saved + inputs, "loss_temporaries": 0, "temporaries": 0}
    out: dict[str, dict[str, int]] = {"forward_end": dict(base)}
    # backward start: d(logits) written into the logits' (donated) buffer; the head matmul's grads
    head_w = D.a * D.V * D.d
    out["backward_start"] = {**base, "temporaries": head_w + D.a * D.d * N + f8_head_bw}
    # the blocks: the loss's saved tensors are gone, the head's fp32 weight grad exists
    head_grad = F32 * D.V * D.d if accum == 1 else 0
    level = dict(base)
    level["activations"] -= parts["loss"] + parts["final_norm"] + parts["head_copy"] + f8_head
    level["gradients"] += head_grad
    b = Walk(0, {}, 1)
    block_bw(D, b, N, "fresh" if accum == 1 else "add")
    out["backward_layers"] = {**level, "temporaries": b.peak + f8_block_bw}
    out["optimizer_step"] = {**fixed, "gradients": grads_all, "activations": inputs, "loss_temporaries": 0,
                             "temporaries": opt_temps}
    return {p: {k: int(kinds.get(k, 0)) for k in BREAKDOWN_KEYS} for p, kinds in out.items()}
