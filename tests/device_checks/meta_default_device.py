"""The model's Triton path (interpreted on CPU tensors) and its PyTorch path with
``torch.set_default_device("meta")`` in force: any tensor the code creates without an explicit
device lands on "meta" and the run fails, which is how a tensor created on the wrong device (a
CUDA bug) shows on a CPU.

Run as a script with TRITON_INTERPRET=1 MATRIS_KERNELS=triton (tests/test_device_hygiene.py
does); prints one line per case and exits non-zero on any failure.
"""

import sys
import traceback
from pathlib import Path

import torch
from ase.build import molecule

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from matris import GraphBatch, MatRIS  # noqa: E402
from matris.structures import to_system  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "official-v0.9"


def run_case(folder: str, dtype: torch.dtype, backend: str) -> None:
    model = MatRIS.from_checkpoint(FIXTURES / folder / "checkpoint.pth.tar").to(dtype)
    model.options.kernels = backend
    atoms = molecule("H2O")  # in a periodic box: bonds, angles and a stress, in few of them
    atoms.set_cell([7.0, 7.5, 8.0])
    atoms.pbc = True
    atoms.rattle(0.05, seed=1)
    graph = GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff, dtype=dtype)
    torch.set_default_device("meta")
    try:
        try:  # the device graph builder too (the GPU path of predict, the calculator and torch-sim)
            import vesin_torch  # noqa: F401

            system = to_system(atoms)
            graph = GraphBatch.from_tensors(
                torch.tensor(system.positions, device="cpu"), torch.tensor(system.cell, device="cpu")[None],
                torch.tensor(system.pbc, device="cpu"), torch.tensor(system.atomic_numbers, device="cpu"),
                [system.num_atoms], model.cutoff, model.three_body_cutoff, dtype=dtype)
        except ImportError:
            pass
        out = model(graph, compute_forces=True, compute_stress=True)  # inference: forces, stress
        assert out.forces.device.type == "cpu" and torch.isfinite(out.forces).all()
        model.train()
        out = model(graph, compute_forces=True, compute_stress=True, create_graph=True)
        loss = out.energy.sum() + (out.forces ** 2).sum() + out.stress.abs().sum()
        loss.backward()  # training-style double backward through the force computation
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(g.device.type == "cpu" for g in grads)
    finally:
        torch.set_default_device(None)
        model.eval()


def main() -> int:
    failed = 0
    cases = [(f, d, "triton") for f in ("small_sh_float64", "small_fourier_float64")
             for d in (torch.float32, torch.float64)]
    cases += [(f, torch.float64, "torch")
              for f in ("small_sh_float64", "small_fourier_float64", "mixed_widths_float64")]
    for folder, dtype, backend in cases:
        name = f"{backend:6s} {folder} {str(dtype).removeprefix('torch.')}"
        try:
            run_case(folder, dtype, backend)
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - report every case
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc(limit=-4)}")
    print("all device checks passed" if not failed else f"{failed} device checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
