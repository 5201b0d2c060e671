"""benchmarks/cpu_speed.py's instrumented calls on a small model (the op profile names the fused
operators; the GEMM floor counts the reference path's MKL GEMMs and puts the model's backend
back), and one round of the whole benchmark."""

import pytest
import torch

from benchmarks.cpu_speed import gemm_floor, op_shares
from matris import MatRIS, MatRISCalculator, MatRISConfig
from matris.bench import standard_structure
from matris.kernels import native


def test_profile_and_gemm_floor_count_the_gemms():
    torch.manual_seed(0)
    config = MatRISConfig(num_layers=1, node_feat_dim=16, edge_feat_dim=16, three_body_feat_dim=16,
                          mlp_hidden_dims=(16,))
    calc = MatRISCalculator(MatRIS(config).eval(), device="cpu", dtype=torch.float32)
    atoms = standard_structure("si", 8).atoms
    shares = op_shares(calc, atoms)
    assert shares["families"]["GEMM"]["ms"] > 0
    if native.library() is not None:
        assert shares["families"]["fused operators"]["ms"] > 0  # the matris::* operators, by their names
    # a backend other than the default and other than the reference ops gemm_floor switches to, so
    # that "put back" cannot pass by a reset to the default
    calc.model.options.kernels = "auto"
    floor = gemm_floor(calc, atoms, chgnet_seconds=0.1)
    assert floor["gflop"] > 0 and floor["gemm_calls"] > 0 and floor["call_seconds"] > 0
    assert floor["floor_seconds"] == pytest.approx(floor["gflop"] / floor["hot_gflops_4096x128x256"])
    assert floor["floor_ratio_vs_chgnet"] == pytest.approx(floor["floor_seconds"] / 0.1)
    assert calc.model.options.kernels == "auto"  # the backend is put back


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_on_the_published_architecture(tmp_path):
    """One round of the smallest run writes a JSON with the published architecture, the CPU's
    instruction set, the native paths that ran and the opt-in heap setting's measured gain; and
    glibc's malloc is as it was afterwards (the setting is opt-in)."""
    import json

    from benchmarks.cpu_speed import main, markdown
    from matris import heap

    out = tmp_path / "cpu_speed.json"
    assert main(["--sizes", "8", "--rounds", "1", "--md-steps", "0", "--no-chgnet", "--no-profile",
                 "--heap-size", "8", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "published_10m" in data["meta"]["model"] and data["meta"]["cpu"]["isa"]
    assert set(data["rows"][0]["seconds"]) == {"fused", "torch"}
    if native.library() is not None:
        assert data["native"]["instruction_set"] == native.instruction_set() in table_isas()
    if data["heap"]["available"]:
        assert data["heap"]["gain"] > 0
        assert not heap._state["active"]
    table = markdown(str(out))
    assert "| Si8 | E+F+S |" in table and data["meta"]["cpu"]["isa"] in table


def table_isas():
    return ("avx512", "avx2", "portable")
