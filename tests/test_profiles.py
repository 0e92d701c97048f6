"""Hardware profiles: every figure sourced, spec strings, prices, bad input."""

import pytest

from planner.errors import PlanError
from planner.profiles import SOURCED_FIELDS, builtin_profiles, load_profile_file, parse_gpu_spec


def test_required_profiles_present_and_sourced() -> None:
    profs = builtin_profiles()
    for name in ("B200", "H200", "H100-SXM", "H100-PCIe", "A100-80GB", "A100-40GB", "CPU"):
        assert name in profs
        p = profs[name]
        assert all(p.sources.get(f) for f in SOURCED_FIELDS)
        assert all(x.date and x.source for x in p.prices)


def test_design_figures() -> None:
    p = builtin_profiles()
    assert p["H100-SXM"].bf16_tflops == 989 and p["H100-SXM"].hbm_tb_s == 3.35
    assert p["B200"].bf16_tflops == 2250 and p["A100-40GB"].memory_gb == 40
    assert p["H100-PCIe"].intra_node_gb_s < p["H100-SXM"].intra_node_gb_s


@pytest.mark.parametrize("spec,nodes,per,name", [
    ("H100", 1, 1, "H100-SXM"), ("4xH100", 1, 4, "H100-SXM"), ("8xH100-PCIe", 1, 8, "H100-PCIe"),
    ("8xA100-40GB", 1, 8, "A100-40GB"), ("2x8xH100", 2, 8, "H100-SXM"), ("8xh200", 1, 8, "H200"),
    ("2xCPU", 1, 2, "CPU"),
])
def test_spec_strings(spec: str, nodes: int, per: int, name: str) -> None:
    hw = parse_gpu_spec(spec)
    assert (hw.nodes, hw.gpus_per_node, hw.profile.name) == (nodes, per, name)


def test_price_override_and_provider() -> None:
    assert parse_gpu_spec("8xH100", price=4.0).usd_per_gpu_hour == 4.0
    assert parse_gpu_spec("8xH100", provider="lambda").usd_per_gpu_hour == 2.99
    with pytest.raises(PlanError, match="--provider"):
        parse_gpu_spec("8xH100", provider="nosuch")
    with pytest.raises(PlanError, match="unknown GPU type"):
        parse_gpu_spec("8xV100")
    with pytest.raises(PlanError, match="2x8x"):
        parse_gpu_spec("16xH100")


def test_bad_profile_file(tmp_path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("name: X\nmemory_gb: -1\n")
    with pytest.raises(PlanError) as e:
        load_profile_file(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    f.write_text("!!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(PlanError, match="not valid YAML"):
        load_profile_file(f)
