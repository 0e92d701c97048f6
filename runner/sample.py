"""What a run's model learned: a few continuations of a prompt from one of its checkpoints (`nanoplan sample`),
with the run's own tokenizer, as nanoGPT's sample.py does.

The checkpoint is the best one (best.json: the lowest validation loss), the newest intact one, or a given step.
The model is rebuilt from the plan recorded in the checkpoint's meta.json (so a moved or edited plan.json does
not matter), its weights read weights-only (model.pt, or DCP shards loaded in memory: nothing is written), and
the tokenizer is the one of the data directory it trained on (meta.json), or `--data DIR`.

Sampling: temperature-scaled softmax over the last position's logits, restricted to the top k, drawn with a
seeded generator, so the same command prints the same text. No KV cache: the context (cropped to the model's
sequence length) is run again for each new token, which is plenty for a look at a small model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from planner.errors import PlanError
from planner.spec import ModelSpec
from runner.checkpoint_layout import complete_steps, step_dir
from runner.checkpoint_meta import read_meta, verify
from runner.checkpoint_retention import latest_good, read_best
from runner.model import GPT
from runner.tokenize import Tokenizer, load_tokenizer


@dataclass
class Samples:
    """What `nanoplan sample` prints: where the weights came from, and the texts."""

    step: int
    which: str                 # "best", "last" or "step"
    val_loss: float | None
    tokenizer: str
    prompt_tokens: int
    texts: list[str]


def pick_checkpoint(run_dir: Path, which: str) -> tuple[Path, str]:
    """The checkpoint directory for `which` ("best", "last", or a step number) and what it is."""
    done = complete_steps(run_dir)
    if not done:
        raise PlanError("RUN_DIR", f"{run_dir} has no complete checkpoint", "pass the run dir of a run that checkpointed")
    if which == "best":
        best = read_best(run_dir)
        if best is not None and int(best["step"]) in done and verify(step_dir(run_dir, int(best["step"])))[0]:
            return step_dir(run_dir, int(best["step"])), "best"
        which = "last"                        # no validation loss recorded (val_every_steps 0): the newest one
    if which == "last":
        found = latest_good(run_dir, log=lambda msg: None)
        if found is None:
            raise PlanError("RUN_DIR", f"no checkpoint in {run_dir} verifies", "see nanoplan run's messages about them")
        return step_dir(run_dir, found[0]), "last"
    if not which.isdigit():
        raise PlanError("--checkpoint", f"{which!r} is not best, last or a step number", "e.g. --checkpoint 2000")
    step = int(which)
    if step not in done:
        listed = ", ".join(str(s) for s in done[-6:])
        raise PlanError("--checkpoint", f"no complete checkpoint of step {step} in {run_dir}", f"use one of {listed}")
    ok, why = verify(step_dir(run_dir, step))
    if not ok:
        raise PlanError("--checkpoint", f"checkpoint of step {step} is not usable: {why}", "pick another step")
    return step_dir(run_dir, step), "step"


def model_spec(ckdir: Path, meta: dict[str, Any]) -> ModelSpec:
    """The model the checkpoint's run trained, from the plan recorded in its meta.json."""
    try:
        return ModelSpec.model_validate((meta.get("plan") or {})["request"]["model"])
    except (KeyError, TypeError, ValueError):
        raise PlanError(str(ckdir / "meta.json"), "does not record the plan's model",
                        "sample a checkpoint written by nanoplan run") from None


def load_weights(ckdir: Path, model: GPT) -> None:
    """The checkpoint's weights into `model` (weights-only reads; DCP shards loaded in memory)."""
    from runner.dcp import MODEL_DIR, check_metadata, has_shards
    from runner.torch_files import load_torch

    if has_shards(ckdir):
        import torch.distributed.checkpoint as dcp

        check_metadata(ckdir / MODEL_DIR)
        state = model.state_dict()
        try:
            with warnings.catch_warnings():   # "torch.distributed is ... uninitialized": one process is the intent
                warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
                dcp.load(state, checkpoint_id=str(ckdir / MODEL_DIR), no_dist=True)
        except Exception as e:  # noqa: BLE001 - an untrusted checkpoint: one line
            raise PlanError(str(ckdir / MODEL_DIR), f"cannot be read ({str(e).strip().splitlines()[0][:200]})",
                            "pick another --checkpoint") from None
    else:
        state = load_torch(ckdir / "model.pt")
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError) as e:
        raise PlanError(str(ckdir), f"does not hold this plan's model ({str(e).splitlines()[0][:200]})",
                        "pick another --checkpoint") from None


def data_dir_of(meta: dict[str, Any], data: str | None) -> Path:
    """The data directory whose tokenizer the run trained with (or --data)."""
    where = data or (meta.get("data") or {}).get("data_dir")
    if not where or not (Path(where) / "meta.json").is_file():
        raise PlanError("--data", f"the run's data directory {where or '(not recorded)'} has no meta.json",
                        "pass --data DIR, the prepared data the run trained on (its tokenizer is needed)")
    return Path(where)


def encode_prompt(tok: Tokenizer, prompt: str) -> list[int]:
    try:
        ids = [int(i) for i in tok.encode(prompt)]
    except (KeyError, ValueError) as e:
        raise PlanError("--prompt", f"cannot be encoded with the run's tokenizer ({e})",
                        "use characters the training text holds") from None
    if not ids:
        raise PlanError("--prompt", "is empty after tokenizing", "give a few words to continue")
    return ids


@torch.no_grad()
def generate(model: GPT, ids: list[int], new_tokens: int, temperature: float, top_k: int | None,
             gen: torch.Generator, device: torch.device) -> list[int]:
    """`ids` followed by `new_tokens` sampled tokens (temperature 0: the most likely token each time)."""
    x = torch.tensor([ids], dtype=torch.long, device=device)
    T = model.spec.seq_len
    autocast = device.type == "cuda"
    for _ in range(new_tokens):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x[:, -T:])[:, -1, :].float()
        if temperature <= 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=gen).to(device)
        x = torch.cat([x, nxt], dim=1)
    return x[0].tolist()


def sample(run_dir: Path, *, prompt: str, num_samples: int, new_tokens: int, temperature: float,
           top_k: int | None, which: str, seed: int, data: str | None) -> Samples:
    """`num_samples` continuations of `prompt` from the chosen checkpoint of RUN_DIR."""
    ckdir, kind = pick_checkpoint(run_dir, which)
    meta = read_meta(ckdir) or {}
    spec = model_spec(ckdir, meta)
    tok = load_tokenizer(data_dir_of(meta, data))
    ids = encode_prompt(tok, prompt)
    if max(ids) >= spec.vocab_size:
        raise PlanError("--data", f"its tokenizer makes id {max(ids)}, beyond the model's vocab of {spec.vocab_size}",
                        "pass the data directory the run trained on")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = GPT(spec)
    load_weights(ckdir, model)
    model.to(device).eval()
    gen = torch.Generator().manual_seed(seed)
    texts = [tok.decode(generate(model, ids, new_tokens, temperature, top_k, gen, device))
             for _ in range(num_samples)]
    val = meta.get("val_loss")
    return Samples(step=int(meta.get("step", int(ckdir.name.rsplit("_", 1)[-1]))), which=kind,
                   val_loss=float(val) if isinstance(val, (int, float)) else None,
                   tokenizer=type(tok).__name__.removesuffix("Tokenizer").lower(), prompt_tokens=len(ids), texts=texts)
