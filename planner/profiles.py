"""Hardware profiles (hardware_profiles/*.yaml) and GPU spec strings such as 2x8xH100."""

from __future__ import annotations

import difflib
import functools
import math
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import PlanError, pydantic_one_line

# Figures every profile must source (the `sources` map names each one).
SOURCED_FIELDS = (
    "memory_gb", "usable_bytes", "hbm_tb_s", "bf16_tflops", "tf32_tflops", "intra_node_gb_s",
    "inter_node_gb_s", "default_mfu",
)

# Plausible physical ranges of a profile's figures, (low, high, unit): a figure outside one is a typo or a crafted
# file, refused naming the file and the field (an absurd one otherwise ends in a NaN, an overflow or a wrong blame).
RANGES: dict[str, tuple[float, float, str]] = {
    "memory_gb": (1, 2048, "GB"),                  # 1 GB to 2 TB per GPU (B200: 180 GB)
    "usable_bytes": (1e8, 2.2e12, "bytes"),        # 0.1 GB to 2,048 GiB (usable is in GiB, so above memory_gb's GB)
    "hbm_tb_s": (0.01, 100, "TB/s"),               # one CPU process's DRAM (CPU.yaml 0.02) to 13x B200's 7.7
    "tflops": (0.01, 1e5, "TFLOP/s"),              # one CPU core (CPU.yaml 0.075) to 44x B200's 2,250 dense bf16
    "gb_s": (0.001, 1e5, "GB/s"),                  # gloo's effective 0.0085 calibrated on a loaded 2-core CPU box
                                                   # (tests/data/calibration) to 55x NVLink5's 1,800 GB/s
    "mfu": (0.001, 1, "fraction of peak"),         # below 0.1% a run is broken, not slow; above 1 is impossible
    "usd_per_gpu_hour": (0.01, 1e4, "$/GPU-hour"),  # a cent to $10k per GPU-hour (H100s rent for $2-$12); 0 = own machine
    "overhead_bytes": (0, 2**36, "bytes"),         # CUDA context / NCCL buffers: none to 64 GiB
    "mtbi_hours": (0.1, 1e5, "hours"),             # 6 min (a run would never finish) to ~11 years between interruptions
    "storage_gb_s": (0.01, 1e4, "GB/s"),           # a slow bucket mount (10 MB/s) to 10 TB/s of parallel filesystem
    "speed_ratio": (0.01, 100, "predicted / measured"),  # a model 100x off either way is broken, not uncalibrated
}


def check_price(usd: float) -> float:
    """A price per GPU-hour: 0 (your own machine) or within RANGES (5e-324 overflows a dollar budget's hours)."""
    lo, hi, unit = RANGES["usd_per_gpu_hour"]
    if 0 < usd < lo:
        raise ValueError(f"{usd!r} is outside the plausible range: 0 (your own machine) or {lo:g} to {hi:g} {unit}")
    return usd


def _in(kind: str, **kw: object) -> Any:
    lo, hi, _ = RANGES[kind]
    return Field(ge=lo, le=hi, allow_inf_nan=False, strict=True, **kw)  # type: ignore[arg-type]


Price_ = Annotated[float, AfterValidator(check_price)]    # $/GPU-hour: 0, or in RANGES

Pos = Field(gt=0, allow_inf_nan=False, strict=True)
# Upper bounds far beyond any real device: absurd figures give a one-line error, not an overflow.
MAX_BYTES = 10**15                       # 1 PB per GPU
# Checkpoint storage of a node when the profile gives none (storage_gb_s): the figure planner/export.py already
# assumes for a shared filesystem or bucket mount.
DEFAULT_STORAGE_GB_S = 1.0
DEFAULT_STORAGE_SOURCE = ("assumption: 1 GB/s to a shared filesystem or bucket mount (planner/export.py "
                          "CHECKPOINT_WRITE_BYTES_PER_S); set storage_gb_s in the profile")


class SpotPrice(BaseModel):
    """A provider's interruptible (spot, preemptible) price, dated and sourced, and how often it interrupts.

    `mtbi_hours` is the mean time between interruptions of one node. No provider publishes one for these
    GPUs, so `mtbi_source` says where the figure comes from: a source, or "assumption: ..." (docs/spot.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    usd_per_gpu_hour: Price_ = Field(ge=0, le=1e4, allow_inf_nan=False, strict=True)
    date: str = Field(min_length=4)
    source: str = Field(min_length=3)
    mtbi_hours: float = _in("mtbi_hours")
    mtbi_source: str = Field(min_length=3)


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    provider: str = Field(min_length=1)
    usd_per_gpu_hour: Price_ = Field(ge=0, le=1e4, allow_inf_nan=False, strict=True)
    date: str = Field(min_length=4)
    source: str = Field(min_length=3)
    spot: SpotPrice | None = None      # the same provider's spot price, where it publishes one


class MfuPoint(BaseModel):
    """A calibrated MFU at a model size (written by `nanoplan calibrate`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    n_params: int = Field(gt=0, le=MAX_BYTES)
    mfu: float = _in("mfu")


FRAGMENTATION = 0.1125   # of the allocated peak: mean + 2 sd of max_memory_reserved / the planner's allocated
                         # peak - 1 over the public calibration rows that publish it and that the planner predicts
                         # within 10% either way (benchmarks/fit_memory.py), fitted on benchmarks/public_runs
                         # calibration set, 2026-11-27


class Overheads(BaseModel):
    """Memory overheads per GPU beyond the allocated peak (planner/fit_verdict.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cuda_context_bytes: int = Field(default=536_870_912, ge=0, le=int(RANGES["overhead_bytes"][1]))   # 512 MiB: assumption
    nccl_bytes: int = Field(default=268_435_456, ge=0, le=int(RANGES["overhead_bytes"][1]))           # 256 MiB with >1 GPU: assumption
    fragmentation: float = Field(default=FRAGMENTATION, ge=0, le=1, allow_inf_nan=False, strict=True)  # of the peak
    source: str = ("fragmentation fitted on benchmarks/public_runs calibration set, 2026-11-27 (benchmarks/fit_memory.py: "
                   "public max_memory_reserved against the allocated peak); CUDA context and NCCL buffers: assumption "
                   "(typical CUDA 12); calibrate with nanoplan calibrate")


SPEED_CHECK_TOL = 0.10   # |median error| above which a plan says its speed is off: issue 25's "within 10%" line


class SpeedCheck(BaseModel):
    """The step-time model against this GPU's public runs: the median of predicted / measured tokens/s over its
    rows of benchmarks/public_runs/runs.yaml (`python benchmarks/public_runs.py`), dated. Off by more than
    SPEED_CHECK_TOL, a plan on this GPU says so (tests/test_public_runs_adapter.py keeps it equal to the benchmark)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    median_ratio: float = _in("speed_ratio")      # predicted / measured tokens/s; 1.69: predicts 69% too fast
    runs: int = Field(ge=1, le=10_000)           # rows with a measured speed
    rows: str = Field(min_length=3)              # what they are: trainer, model, GPUs, source
    date: str = Field(min_length=4)


def speed_off(profile: HardwareProfile) -> SpeedCheck | None:
    """This GPU's public check when the speed model is off by more than SPEED_CHECK_TOL there, else None."""
    c = profile.speed.public_check if profile.speed is not None else None
    return c if c is not None and abs(c.median_ratio - 1) > SPEED_CHECK_TOL else None


def speed_off_words(c: SpeedCheck) -> str:
    """'+69% vs its 2 public runs'."""
    return f"{c.median_ratio - 1:+.0%} vs its {c.runs} public run{'s' if c.runs > 1 else ''}"


class Speed(BaseModel):
    """What the step-time model (planner/throughput.py) reads of a GPU beyond its datasheet: the dense matmul
    rate torch really reaches on it. Without this section a profile uses the flat `default_mfu`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    architecture: Literal["ampere", "ada", "hopper", "blackwell"]   # NVIDIA generation (speed_constants by it)
    matmul_tflops: float = _in("tflops")                   # TFLOP/s: achievable dense bf16 GEMM (best shape)
    fp8_matmul_tflops: float | None = _in("tflops", default=None)
    source: str = Field(min_length=3)
    attention_tflops: float = _in("tflops")                # TFLOP/s: flash attention forward + backward, causal, bf16
    attention_source: str = Field(min_length=3)
    public_check: SpeedCheck | None = None                 # how the model did on this GPU's public runs

    def scaled(self, t: int) -> Speed:
        """t GPUs taken as one device (used only to approximate tensor parallelism in benchmarks)."""
        return self.model_copy(update={
            "matmul_tflops": self.matmul_tflops * t, "attention_tflops": self.attention_tflops * t,
            "fp8_matmul_tflops": self.fp8_matmul_tflops * t if self.fp8_matmul_tflops else None})


class HardwareProfile(BaseModel):
    """One GPU type. Units are in the field names; `sources` names the source of each figure."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    description: str = ""
    aliases: list[str] = []
    kind: Literal["gpu", "cpu"] = "gpu"
    memory_gb: float = _in("memory_gb")
    usable_bytes: int = Field(ge=int(RANGES["usable_bytes"][0]), le=int(RANGES["usable_bytes"][1]))
    hbm_tb_s: float = _in("hbm_tb_s")
    bf16_tflops: float = _in("tflops")
    fp8_tflops: float | None = _in("tflops", default=None)
    tf32_tflops: float = _in("tflops")
    fp32_tflops: float | None = _in("tflops", default=None)
    intra_node_gb_s: float = _in("gb_s")
    inter_node_gb_s: float = _in("gb_s")
    gpus_per_node: int = Field(gt=0, le=1024)
    default_mfu: float = _in("mfu")
    mfu_curve: list[MfuPoint] = []
    speed: Speed | None = None
    overheads: Overheads = Overheads()
    default_provider: str
    prices: list[Price] = Field(min_length=1)
    storage_gb_s: float | None = _in("storage_gb_s", default=None)  # checkpoints
    sources: dict[str, str]

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        missing = [f for f in SOURCED_FIELDS if f not in self.sources]
        if missing:
            raise ValueError(f"sources is missing {', '.join(missing)}: every figure needs a source")
        if self.storage_gb_s is not None and "storage_gb_s" not in self.sources:
            raise ValueError("sources is missing storage_gb_s: every figure needs a source")
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

    def spot_price(self, provider: str | None = None) -> tuple[Price, SpotPrice]:
        """A provider's spot price: the one asked for, else the default provider's, else the cheapest."""
        with_spot = [p for p in self.prices if p.spot is not None]
        if provider is not None:
            p = self.price(provider)
            if p.spot is None:
                have = ", ".join(q.provider for q in with_spot) or "none of its providers"
                raise PlanError("--provider", f"{p.provider} publishes no spot price for {self.name}",
                                f"spot prices: {have}; or give --price USD_PER_GPU_HOUR with --spot")
            return p, p.spot
        if not with_spot:
            raise PlanError("--spot", f"no spot price for {self.name}",
                            "give --price USD_PER_GPU_HOUR (your spot price) with --spot; docs/spot.md")
        d = self.price()
        if d.spot is not None:
            return d, d.spot
        best = min(with_spot, key=lambda q: q.spot.usd_per_gpu_hour)  # type: ignore[union-attr]
        return best, best.spot  # type: ignore[return-value]

    def storage_bytes_per_s(self) -> tuple[float, str]:
        """Checkpoint write/read bandwidth of one node (bytes/s) and its source."""
        if self.storage_gb_s is not None:
            return self.storage_gb_s * 1e9, self.sources.get("storage_gb_s", "the profile's storage_gb_s")
        return DEFAULT_STORAGE_GB_S * 1e9, DEFAULT_STORAGE_SOURCE

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for the precision the runner uses."""
        if precision == "fp32":
            return (self.tf32_tflops if self.kind == "gpu" else (self.fp32_tflops or self.tf32_tflops)) * 1e12
        return self.bf16_tflops * 1e12

    def mfu_for(self, n_params: int) -> float:
        """MFU at a model size: the calibrated curve when there is one (log-linear in N, clamped), else
        `default_mfu` × `size_factor(n_params)` on GPUs (default_mfu is read as the MFU of a model of
        SIZE_REFERENCE_PARAMS); CPU profiles use default_mfu as it is."""
        if self.mfu_curve:
            return _loglinear([(p.n_params, p.mfu) for p in self.mfu_curve], n_params)
        if self.kind != "gpu":
            return self.default_mfu
        return min(1.0, self.default_mfu * size_factor(n_params))


# MFU against model size, one sweep on one code base and one GPU: llm-foundry's MPT benchmarks on 8x A100-80GB,
# bf16, seq 2048, FSDP, no activation checkpointing (mosaicml/llm-foundry scripts/train/benchmarking/README.md,
# "A100 80GB with 1600 Gbps node-node interconnect" table): (parameters, MFU).
SIZE_MFU_POINTS: tuple[tuple[int, float], ...] = (
    (125_311_488, 0.4479),      # 125m
    (355_985_408, 0.5162),      # 350m
    (760_470_528, 0.5685),      # 760m
    (1_315_950_592, 0.5986),    # 1b
    (2_651_837_440, 0.6211),    # 3b
    (6_658_859_008, 0.6423),    # 7b
)
SIZE_REFERENCE_PARAMS = 1_315_950_592   # a profile's default_mfu is taken to be the MFU at this size (the 1b row)


def _loglinear(points: list[tuple[int, float]], n: int) -> float:
    """Piecewise-linear interpolation in log(N), clamped to the end points."""
    pts = sorted(points)
    if n <= pts[0][0]:
        return pts[0][1]
    if n >= pts[-1][0]:
        return pts[-1][1]
    for (n0, y0), (n1, y1) in zip(pts, pts[1:], strict=False):
        if n0 <= n <= n1:
            t = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return y0 + t * (y1 - y0)
    return pts[-1][1]  # pragma: no cover


def size_factor(n_params: int) -> float:
    """MFU at `n_params` relative to SIZE_REFERENCE_PARAMS, from SIZE_MFU_POINTS (flat beyond their range:
    0.748 at 125M and below, 1.073 at 6.7B and above). Smaller models have smaller matmuls, so lower MFU."""
    return _loglinear(list(SIZE_MFU_POINTS), n_params) / _loglinear(list(SIZE_MFU_POINTS), SIZE_REFERENCE_PARAMS)


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


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last one silently (a
    second `default_provider` changed the price; plan.json refuses duplicates too)."""


def _unique_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:
            continue                     # an unhashable key: construct_mapping refuses it below
        if first != key_node.start_mark.line + 1:
            raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} appears twice (lines {first} and "
                                                    f"{key_node.start_mark.line + 1})", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _load_yaml_profile(text: str, origin: str, trusted: bool = False) -> HardwareProfile:
    """A profile from YAML text. User files go through a safe loader that refuses duplicate keys; the shipped
    ones (trusted package data) through libyaml's CSafeLoader when present: the same safe constructors, ~10x
    faster, which keeps `nanoplan estimate` quick with 14 profiles to read."""
    try:
        fast = getattr(yaml, "CSafeLoader", None) if trusted else None
        data = yaml.load(text, Loader=fast or _StrictLoader)  # noqa: S506 - safe loaders only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        fix = ("keep one of them" if "appears twice" in str(what) else
               "fix the syntax; tags such as !!python/... are refused")
        raise PlanError(origin, f"not valid YAML{where}: {what}", fix) from None
    except RecursionError:
        raise PlanError(origin, "not valid YAML: nested too deeply", "fix the syntax") from None
    except ValueError as e:              # a 5,000-digit integer (Python's int conversion limit)
        raise PlanError(origin, f"not a profile ({str(e).split(';')[0][:120]})", "fix the number") from None
    if not isinstance(data, dict):
        raise PlanError(origin, "a profile must be a YAML mapping of fields", "see hardware_profiles/H100-SXM.yaml")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as e:
        raise PlanError(origin, _range_problem(e) or pydantic_one_line(e), "see hardware_profiles/H100-SXM.yaml") from None


_RANGE_OF = {"memory_gb": "memory_gb", "usable_bytes": "usable_bytes", "hbm_tb_s": "hbm_tb_s", "mfu": "mfu",
             "default_mfu": "mfu", "cuda_context_bytes": "overhead_bytes", "nccl_bytes": "overhead_bytes",
             "mtbi_hours": "mtbi_hours", "storage_gb_s": "storage_gb_s", "median_ratio": "speed_ratio"}


def _range_problem(e: ValidationError) -> str | None:
    """"field 'F': V is outside the plausible range LO to HI UNIT" for a figure out of RANGES, else None."""
    err = e.errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    if not loc or err.get("type") not in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return None
    name = loc[-1]
    kind = _RANGE_OF.get(name) or next((k for k in ("tflops", "gb_s") if name.endswith("_" + k)), None)
    if kind is None:
        return None
    lo, hi, unit = RANGES[kind]
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"field '{'.'.join(loc)}': {err.get('input')!r} is outside the plausible range {lo:g} to {hi:g} {unit}{more}"


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


_HEAD_NAME = re.compile(r"^name:[ \t]*(\S+)[ \t]*$", re.MULTILINE)
_HEAD_ALIASES = re.compile(r"^aliases:[ \t]*\[([^\]\n]*)\]", re.MULTILINE)


@functools.cache
def _shipped() -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """{profile name: (file name, YAML text, aliases)} of the shipped profiles, in file order. The names and
    aliases are read from each file's `name:` and `aliases: [...]` lines (tests/test_profiles.py holds them to
    the parsed profiles), so finding one profile parses one file, not all 14 (5 ms of `estimate`'s start-up)."""
    out: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for f in sorted(resources.files("hardware_profiles").iterdir(), key=lambda f: f.name):
        if f.name.endswith(".yaml"):
            text = f.read_text(encoding="utf-8")
            name, aliases = _HEAD_NAME.search(text), _HEAD_ALIASES.search(text)
            out[name.group(1) if name else f.name] = (f.name, text, tuple(
                a.strip().strip("'\"") for a in (aliases.group(1).split(",") if aliases else ()) if a.strip()))
    return out


@functools.cache
def _shipped_profile(name: str) -> HardwareProfile:
    fname, text, _ = _shipped()[name]
    return _load_yaml_profile(text, f"hardware_profiles/{fname}", trusted=True)


@functools.cache
def builtin_profiles() -> dict[str, HardwareProfile]:
    out: dict[str, HardwareProfile] = {}
    for name in _shipped():
        prof = _shipped_profile(name)
        out[prof.name] = prof
    return out


def _names() -> dict[str, str]:
    """Every accepted spelling (lower case), names and aliases: the profile's name."""
    out: dict[str, str] = {}
    for name, (_, _, aliases) in _shipped().items():
        for n in (name, *aliases):
            out[n.lower()] = name
    return out


def _as_typed(match: str, name: str) -> str:
    """How to write a matched spelling back: the profile's own casing ('h100' -> 'H100')."""
    squeeze = str.maketrans("", "", "-_ ")
    if match.translate(squeeze) == name.lower().translate(squeeze):
        return name
    if name.lower().startswith(match):
        return name[: len(match)]
    return match.upper() if match.replace("-", "").isalnum() else match


def find_profile(name: str, option: str = "--gpu", counts: str = "", profile_hint: bool = True) -> HardwareProfile:
    """The built-in profile called `name` (or an alias); an unknown name gets 'did you mean ...?'."""
    key = name.strip().lower()
    names = _names()
    if key in names:
        return _shipped_profile(names[key])
    squeezed = {k.replace("-", "").replace("_", ""): v for k, v in names.items()}
    if key.replace("-", "").replace("_", "").replace(" ", "") in squeezed:
        return _shipped_profile(squeezed[key.replace("-", "").replace("_", "").replace(" ", "")])
    near = difflib.get_close_matches(key, list(names), n=2, cutoff=0.6)
    allowed = ", ".join(builtin_profiles())
    more = ", or --profile FILE.yaml" if profile_hint else ""
    if near:
        guess = " or ".join(dict.fromkeys(f"{counts}{_as_typed(m, names[m])}" for m in near))   # two aliases, one name
        raise PlanError(option, f"unknown GPU type {name!r}", f"did you mean {guess}? (known: {allowed}{more})")
    raise PlanError(option, f"unknown GPU type {name!r}", f"known: {allowed}{more}; nanoplan profiles lists them")


_NAME = r"[A-Za-z][\w.\- ]*?"   # spaces allowed inside: "RTX 4090"
_SPEC_FORMS = (   # (regex, group roles) tried in order on the spec with '×'/'*' read as 'x'
    (re.compile(rf"^(\d+)\s*x\s*(\d+)\s*x\s*({_NAME})$", re.IGNORECASE), ("nodes", "per", "name")),   # 2x8xH100
    (re.compile(rf"^(\d+)\s*(?:x\s*|\s)({_NAME})$", re.IGNORECASE), ("per", "name")),                # 8xH100, 8 H100
    (re.compile(rf"^({_NAME})\s*x\s*(\d+)$", re.IGNORECASE), ("name", "per")),                         # H100x8
    (re.compile(rf"^({_NAME})$", re.IGNORECASE), ("name",)),                                            # H100
)


def split_gpu_spec(spec: str, option: str = "--gpu") -> tuple[int, int, str]:
    """(nodes, GPUs per node, type) of '8xH100', '8x H100', '8 × H100', 'h100x8', '2x8xH100' or 'H100'."""
    text = spec.strip().replace("×", "x").replace("*", "x")
    if text.lower() in _names():                 # a profile whose own name ends in x<digits> stays whole
        return 1, 1, text
    for rx, roles in _SPEC_FORMS:
        m = rx.match(text)
        if m:
            got = dict(zip(roles, m.groups(), strict=True))
            return int(got.get("nodes", 1)), int(got.get("per", 1)), got["name"].strip()
    raise PlanError(option, f"cannot read {spec!r} as GPUs", "use e.g. H100, 8xH100, 8xA100-40GB or 2x8xH100 "
                    "(nodes x GPUs per node x type)")


def parse_gpu_spec(spec: str, profile: HardwareProfile | None = None, provider: str | None = None,
                   price: float | None = None, *, option: str = "--gpu", price_per: str = "gpu",
                   profile_hint: bool = True) -> Hardware:
    """'H100' | '4xH100' | '8xH100-PCIe' | '2x8xH100' (nodes x GPUs per node x type); also '8x H100', 'h100x8'.

    `price` is USD per GPU-hour, or per node-hour with price_per='node' (a node: the GPUs per node of
    the spec). `option` names the CLI option in errors (compare calls it --gpus)."""
    nodes, per_node, name = split_gpu_spec(spec, option)
    if nodes < 1 or per_node < 1:
        raise PlanError(option, f"{spec!r} asks for zero GPUs", "use at least 1, e.g. 8xH100")
    prof = profile if profile is not None else find_profile(
        name, option, counts=(f"{nodes}x{per_node}x" if nodes > 1 else f"{per_node}x" if per_node > 1 else ""),
        profile_hint=profile_hint)
    if per_node > prof.gpus_per_node:
        raise PlanError(option, f"{per_node} GPUs per node, but {prof.name} has at most {prof.gpus_per_node}",
                        f"use nodes x GPUs, e.g. {math.ceil(per_node / prof.gpus_per_node)}x{prof.gpus_per_node}x{name}")
    if price is not None:
        flag = "--price-per-node" if price_per == "node" else "--price"
        if not math.isfinite(price) or price < 0:
            raise PlanError(flag, f"must be a non-negative number of USD per {price_per}-hour, got {price}")
        per_gpu = price / per_node if price_per == "node" else price
        try:
            check_price(per_gpu)
        except ValueError as e:
            raise PlanError(flag, str(e), "give the price in USD, e.g. --price 2.5; 0 for your own machine") from None
        how = (f"{flag} on the command line (${price:g}/node-hour over {per_node} GPUs)" if price_per == "node"
               else f"{flag} on the command line")
        prov, usd, date, src = provider or "custom", per_gpu, "user", how
    else:
        p = prof.price(provider)
        prov, usd, date, src = p.provider, p.usd_per_gpu_hour, p.date, p.source
    canonical = f"{nodes}x{per_node}x{prof.name}" if nodes > 1 else f"{per_node}x{prof.name}"
    return Hardware(spec=canonical, profile=prof, nodes=nodes, gpus_per_node=per_node, provider=prov,
                    usd_per_gpu_hour=usd, price_date=date, price_source=src)
