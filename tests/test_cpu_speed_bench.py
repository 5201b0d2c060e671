"""benchmarks/cpu_speed.py's instrumented calls on a small model: the op profile and the GEMM
floor wrap ``native.Matmul`` and must pass every argument through (a wrapper that did not
stopped a committed benchmark run after its timing rounds)."""

import sys
from pathlib import Path

import torch

from matris import MatRIS, MatRISCalculator, MatRISConfig
from matris.bench import standard_structure
from matris.kernels import native

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.cpu_speed import gemm_floor, op_shares  # noqa: E402


def test_profile_and_gemm_floor_count_the_native_gemm():
    torch.manual_seed(0)
    config = MatRISConfig(num_layers=1, node_feat_dim=16, edge_feat_dim=16, three_body_feat_dim=16,
                          mlp_hidden_dims=(16,))
    calc = MatRISCalculator(MatRIS(config).eval(), device="cpu", dtype=torch.float32)
    atoms = standard_structure("si", 8).atoms
    shares = op_shares(calc, atoms)
    assert shares["families"]["GEMM"]["ms"] > 0
    assert shares["families"]["fused C++ loops"]["ms"] > 0  # the matris::* operators, by their names
    floor = gemm_floor(calc, atoms, chgnet_seconds=0.1)
    assert floor["gflop"] > 0 and floor["floor_ratio_vs_chgnet"] > 0
    if native.gemm_enabled():
        assert floor["native_gemm_calls"] > 0 and 0 < floor["native_gflop"] <= floor["gflop"]
        assert floor["mkl_only"]["gemm_seconds"] > 0
        assert floor["chunk_loops"]["call_seconds"] > 0 and floor["call_seconds"] > 0
    assert native.whole_calls() == native.gemm_enabled()  # the profile's and the floor's switches are put back


def test_the_benchmark_runs_end_to_end_on_the_published_architecture(tmp_path):
    """One round of the smallest run writes a JSON with the published architecture, the CPU's
    instruction set, the native paths that ran and the opt-in heap setting's measured gain; and
    glibc's malloc is as it was afterwards (the setting is opt-in)."""
    import json

    from benchmarks.cpu_speed import main, markdown
    from matris.kernels import heap

    out = tmp_path / "cpu_speed.json"
    assert main(["--sizes", "8", "--rounds", "1", "--md-steps", "0", "--no-chgnet", "--no-profile",
                 "--heap-size", "8", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "published_10m" in data["meta"]["model"] and data["meta"]["cpu"]["isa"]
    assert set(data["rows"][0]["seconds"]) == {"fused", "torch"}
    assert data["native"]["whole_passes"] == native.whole_calls()
    if data["heap"]["available"]:
        assert data["heap"]["gain"] > 0
        assert not heap._state["active"]
    table = markdown(str(out))
    assert "| Si8 | E+F+S |" in table and data["meta"]["cpu"]["isa"] in table
