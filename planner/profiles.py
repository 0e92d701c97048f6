"""Hardware profiles (hardware_profiles/*.yaml) and GPU spec strings such as 2x8xH100."""

from __future__ import annotations

import functools
import math
import re
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import PlanError, pydantic_one_line

# Figures every profile must source (the `sources` map names each one).
SOURCED_FIELDS = (
    "memory_gb", "usable_bytes", "hbm_tb_s", "bf16_tflops", "tf32_tflops", "intra_node_gb_s",
    "inter_node_gb_s", "default_mfu",
)

Pos = Field(gt=0, allow_inf_nan=False, strict=True)
# Upper bounds far beyond any real device: absurd figures give a one-line error, not an overflow.
MAX_BYTES = 10**15                       # 1 PB per GPU
MAX_TFLOPS = 1e6                         # 1 EFLOP/s per GPU
MAX_GB_S = 1e6                           # 1 PB/s per link
Tflops = Field(gt=0, le=MAX_TFLOPS, allow_inf_nan=False, strict=True)
GbS = Field(gt=0, le=MAX_GB_S, allow_inf_nan=False, strict=True)


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    provider: str = Field(min_length=1)
    usd_per_gpu_hour: float = Field(ge=0, le=1e4, allow_inf_nan=False, strict=True)
    date: str = Field(min_length=4)
    source: str = Field(min_length=3)


class MfuPoint(BaseModel):
    """A calibrated MFU at a model size (written by `nanoplan calibrate`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    n_params: int = Field(gt=0, le=MAX_BYTES)
    mfu: float = Field(gt=0, le=1, allow_inf_nan=False, strict=True)


class Overheads(BaseModel):
    """Fixed memory overheads per GPU. Defaults are assumptions until calibrated on a GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cuda_context_bytes: int = Field(default=536_870_912, ge=0, le=MAX_BYTES)   # 512 MiB: assumption
    nccl_bytes: int = Field(default=268_435_456, ge=0, le=MAX_BYTES)           # 256 MiB with >1 GPU: assumption
    fragmentation: float = Field(default=0.05, ge=0, le=1, allow_inf_nan=False, strict=True)  # of the peak: assumption
    source: str = "assumption: typical CUDA 12 context and NCCL buffers; calibrate with nanoplan calibrate"


class HardwareProfile(BaseModel):
    """One GPU type. Units are in the field names; `sources` names the source of each figure."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    description: str = ""
    aliases: list[str] = []
    kind: Literal["gpu", "cpu"] = "gpu"
    memory_gb: float = Field(gt=0, le=MAX_BYTES / 1e9, allow_inf_nan=False, strict=True)
    usable_bytes: int = Field(gt=0, le=MAX_BYTES)
    hbm_tb_s: float = Field(gt=0, le=MAX_GB_S / 1e3, allow_inf_nan=False, strict=True)
    bf16_tflops: float = Tflops
    fp8_tflops: float | None = Field(default=None, gt=0, le=MAX_TFLOPS, allow_inf_nan=False, strict=True)
    tf32_tflops: float = Tflops
    fp32_tflops: float | None = Field(default=None, gt=0, le=MAX_TFLOPS, allow_inf_nan=False, strict=True)
    intra_node_gb_s: float = GbS
    inter_node_gb_s: float = GbS
    gpus_per_node: int = Field(gt=0, le=1024)
    default_mfu: float = Field(gt=0, le=1, allow_inf_nan=False, strict=True)
    mfu_curve: list[MfuPoint] = []
    overheads: Overheads = Overheads()
    default_provider: str
    prices: list[Price] = Field(min_length=1)
    sources: dict[str, str]

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        missing = [f for f in SOURCED_FIELDS if f not in self.sources]
        if missing:
            raise ValueError(f"sources is missing {', '.join(missing)}: every figure needs a source")
        if self.default_provider not in {p.provider for p in self.prices}:
            raise ValueError(f"default_provider {self.default_provider!r} has no entry in prices")
        return self

    def price(self, provider: str | None = None) -> Price:
        want = (provider or self.default_provider).lower()
        for p in self.prices:
            if p.provider.lower() == want:
                return p
        allowed = ", ".join(p.provider for p in self.prices)
        raise PlanError("--provider", f"no price for {provider!r} on {self.name}",
                        f"allowed: {allowed}, or give --price USD_PER_GPU_HOUR")

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for the precision the runner uses."""
        if precision == "fp32":
            return (self.tf32_tflops if self.kind == "gpu" else (self.fp32_tflops or self.tf32_tflops)) * 1e12
        return self.bf16_tflops * 1e12

    def mfu_for(self, n_params: int) -> float:
        """MFU at a model size: calibrated curve (log-linear in N, clamped) or the default."""
        pts = sorted(self.mfu_curve, key=lambda p: p.n_params)
        if not pts:
            return self.default_mfu
        if n_params <= pts[0].n_params:
            return pts[0].mfu
        if n_params >= pts[-1].n_params:
            return pts[-1].mfu
        for a, b in zip(pts, pts[1:], strict=False):
            if a.n_params <= n_params <= b.n_params:
                t = (math.log(n_params) - math.log(a.n_params)) / (math.log(b.n_params) - math.log(a.n_params))
                return a.mfu + t * (b.mfu - a.mfu)
        return self.default_mfu  # pragma: no cover


class Hardware(BaseModel):
    """A chosen cluster: profile x GPUs per node x nodes, at a price."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    spec: str
    profile: HardwareProfile
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    provider: str
    usd_per_gpu_hour: float = Field(ge=0, allow_inf_nan=False, strict=True)
    price_date: str
    price_source: str

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _load_yaml_profile(text: str, origin: str) -> HardwareProfile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PlanError(origin, f"not valid YAML{where}: {what}", "fix the syntax; tags such as !!python/... are refused") from None
    except RecursionError:
        raise PlanError(origin, "not valid YAML: nested too deeply", "fix the syntax") from None
    if not isinstance(data, dict):
        raise PlanError(origin, "a profile must be a YAML mapping of fields", "see hardware_profiles/H100-SXM.yaml")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as e:
        raise PlanError(origin, pydantic_one_line(e), "see hardware_profiles/H100-SXM.yaml") from None


def load_profile_file(path: str | Path) -> HardwareProfile:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise PlanError("--profile", f"cannot read {p}: {e.strerror}", "give an existing YAML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(str(p), "is not UTF-8 text", "save the profile as UTF-8 YAML") from None
    return _load_yaml_profile(text, str(p))


@functools.cache
def builtin_profiles() -> dict[str, HardwareProfile]:
    out: dict[str, HardwareProfile] = {}
    for f in sorted(resources.files("hardware_profiles").iterdir(), key=lambda f: f.name):
        if f.name.endswith(".yaml"):
            prof = _load_yaml_profile(f.read_text(encoding="utf-8"), f"hardware_profiles/{f.name}")
            out[prof.name] = prof
    return out


def find_profile(name: str) -> HardwareProfile:
    key = name.lower()
    for prof in builtin_profiles().values():
        if key == prof.name.lower() or key in (a.lower() for a in prof.aliases):
            return prof
    allowed = ", ".join(builtin_profiles())
    raise PlanError("--gpu", f"unknown GPU type {name!r}", f"allowed: {allowed}, or --profile FILE.yaml")


_SPEC = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(?:(\d+)\s*x\s*)?([A-Za-z][\w.\-]*)\s*$", re.IGNORECASE)


def parse_gpu_spec(spec: str, profile: HardwareProfile | None = None, provider: str | None = None,
                   price: float | None = None) -> Hardware:
    """'H100' | '4xH100' | '8xH100-PCIe' | '2x8xH100' (nodes x GPUs per node x type)."""
    m = _SPEC.match(spec)
    if not m:
        raise PlanError("--gpu", f"cannot read {spec!r}", "use e.g. H100, 8xH100, 8xA100-40GB or 2x8xH100")
    a, b, name = m.groups()
    nodes, per_node = (int(a), int(b)) if b is not None else (1, int(a) if a else 1)
    prof = profile if profile is not None else find_profile(name)
    if nodes < 1 or per_node < 1:
        raise PlanError("--gpu", f"{spec!r} asks for zero GPUs", "use at least 1, e.g. 8xH100")
    if per_node > prof.gpus_per_node:
        raise PlanError("--gpu", f"{per_node} GPUs per node, but {prof.name} has at most {prof.gpus_per_node}",
                        f"use nodes x GPUs, e.g. {math.ceil(per_node / prof.gpus_per_node)}x{prof.gpus_per_node}x{name}")
    if price is not None:
        if not math.isfinite(price) or price < 0:
            raise PlanError("--price", f"must be a non-negative number of USD per GPU-hour, got {price}")
        prov, usd, date, src = provider or "custom", price, "user", "--price on the command line"
    else:
        p = prof.price(provider)
        prov, usd, date, src = p.provider, p.usd_per_gpu_hour, p.date, p.source
    canonical = f"{nodes}x{per_node}x{prof.name}" if nodes > 1 else f"{per_node}x{prof.name}"
    return Hardware(spec=canonical, profile=prof, nodes=nodes, gpus_per_node=per_node, provider=prov,
                    usd_per_gpu_hour=usd, price_date=date, price_source=src)
