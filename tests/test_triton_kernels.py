"""The Triton kernels on CPU: interpreter parity with the references, GPU compilation, and the
whole model through the Triton path (TRITON_INTERPRET=1). The checks run in processes of their own
(TRITON_INTERPRET is read at import); their outcomes are read from structured results (JSON, JUnit
XML), not from printed text."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MATRIS_KERNELS")}
    env.update(extra)
    return env


def run_tests(tmp_path: Path, args: list[str], **env) -> dict[str, str]:
    """pytest ``args`` in a process of its own → {test id: "passed" | "failed" | "skipped"}."""
    report = tmp_path / "junit.xml"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                          *args], capture_output=True, text=True, env=_env(**env), timeout=1200, cwd=ROOT / "tests")
    assert report.is_file(), res.stdout[-4000:] + res.stderr[-4000:]
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcomes[case.get("name")] = outcome
    assert "failed" not in outcomes.values(), res.stdout[-4000:] + res.stderr[-4000:]
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return outcomes


@pytest.mark.slow
def test_kernel_checks_pass(tmp_path):
    """python -m benchmarks.kernels --check: the basis kernels vs their references (forward, backward,
    second order, gradcheck) in the interpreter, and every kernel compiled for sm_80 and sm_90."""
    out = tmp_path / "checks.json"
    res = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--check", "--json", str(out)],
                         capture_output=True, text=True, env=_env(), timeout=1200, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    result = json.loads(out.read_text())
    checks = result["checks"]
    assert result["exit_codes"] == [0, 0] and checks and all(c["ok"] for c in checks), res.stdout[-4000:]
    compiled = {cap: {c["name"].removesuffix(f" sm_{cap}") for c in checks if c["name"].endswith(f" sm_{cap}")}
                for cap in (80, 90)}
    assert compiled[80] == compiled[90] and len(compiled[90]) >= 33, compiled
    assert len(checks) > 2 * len(compiled[90])  # the interpreter's comparisons ran too


@pytest.mark.slow
def test_model_parity_through_triton_kernels(tmp_path):
    """Fixture parity with the fused attention and basis kernels (interpreted on CPU)."""
    selection = "small_sh_float64-H2O or small_fourier_float64-H2O or mixed_widths_float64-NaCl"
    outcomes = run_tests(tmp_path, [str(ROOT / "tests" / "test_parity.py"), "-k", selection],
                         TRITON_INTERPRET="1", MATRIS_KERNELS="triton")
    assert len(outcomes) == 3 and set(outcomes.values()) == {"passed"}, outcomes
    # the lowest memory level through the Triton kernels, its angles in several chunks
    outcomes = run_tests(tmp_path, [str(ROOT / "tests" / "test_memory_paths.py"), "-k",
                                    "test_checkpointing_levels_give_the_same_numbers and triton-3-chunks"],
                         TRITON_INTERPRET="1")
    assert len(outcomes) == 1 and set(outcomes.values()) == {"passed"}, outcomes


@pytest.mark.slow
def test_published_family_through_triton_kernels_equals_the_official_1_0_code(tmp_path):
    """The published family (Fourier, LayerNorm, no biases) on the Triton path (interpreted on CPU)
    gives the official MatRIS 1.0.0's float64 numbers (tests/fixtures/official-v1.0)."""
    outcomes = run_tests(tmp_path, [str(ROOT / "tests" / "test_published_architecture.py"), "-k",
                                    "official_1_0_code and None"], TRITON_INTERPRET="1", MATRIS_KERNELS="triton")
    assert len(outcomes) == 1 and set(outcomes.values()) == {"passed"}, outcomes


@pytest.mark.slow
def test_phi_fusions_write_and_save_less(tmp_path):
    """One gated Φ as the fused operator (matris::gated_phi's Triton kernels) writes < 1/2.5 of the
    reference's edge-sized bytes and saves < 1/1.4 of its activations for the backward (counted, not
    timed)."""
    out = tmp_path / "memory.json"
    res = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--memory", "--rows", "512",
                          "--json", str(out)], capture_output=True, text=True, env=_env(TRITON_INTERPRET="1"),
                         timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    report = json.loads(out.read_text())
    ref, fused = report["reference"], report["fused"]
    assert ref["edge_bytes_written"] / fused["edge_bytes_written"] > 2.5, report
    saved = "saved_bytes_excluding_weights_and_inputs"
    assert ref[saved] / fused[saved] > 1.4, report


@pytest.mark.slow
def test_operators_cuda_kernels_pass_opcheck_and_match_their_references(tmp_path):
    """The CUDA (Triton) kernels of matris::gated_phi, attention_pair and refine_edges, interpreted
    on CPU tensors: opcheck, and values and gradients against the references in float64
    (tests/test_operators.py and the operator tests of test_chunked.py; gradcheck is left to the
    C++ kernels, whose backward outputs test_operators.py shows equal to these)."""
    outcomes = run_tests(tmp_path, [str(ROOT / "tests" / "test_operators.py"), str(ROOT / "tests" / "test_chunked.py"),
                                    "-k", "not model and not last_block and not gradcheck"], TRITON_INTERPRET="1")
    skipped = sorted(name for name, outcome in outcomes.items() if outcome == "skipped")
    # only the comparisons with the C++ kernels skip (they run from the uninterpreted process)
    assert skipped == ["test_basis_frequency_sums_do_not_depend_on_the_thread_count",
                       "test_triton_kernels_return_what_the_cpu_kernels_return"], skipped
    assert sum(outcome == "passed" for outcome in outcomes.values()) >= 10, outcomes
