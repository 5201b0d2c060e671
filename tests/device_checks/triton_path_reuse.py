"""On the model's Triton path (run with TRITON_INTERPRET=1; tests/test_device_hygiene.py does):

1. the CSR layouts come from the graph, built once: two calls on one graph sort nothing;
2. inference (create_graph off) launches every fused backward without weight gradients,
   leaves the weights' requires_grad as it found them, and training still gets them.

Prints one line per check and exits non-zero on any failure.
"""

import sys
from pathlib import Path

import torch
from ase.build import molecule

ROOT = Path(__file__).resolve().parents[2]

from matris import GraphBatch, MatRIS  # noqa: E402
from matris.kernels import Segments, basis, phi  # noqa: E402
from matris.structures import to_system  # noqa: E402


def main() -> int:
    model = MatRIS.from_checkpoint(ROOT / "tests" / "fixtures" / "official-v0.9" / "small_sh_float64" /
                                   "checkpoint.pth.tar").double()
    model.options.kernels = "triton"
    atoms = molecule("H2O")  # in a periodic box: bonds, angles and a stress, few of them (fast in the interpreter)
    atoms.set_cell([7.0, 7.5, 8.0])
    atoms.pbc = True
    atoms.rattle(0.05, seed=2)
    batch = GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff, dtype=torch.float64)
    batch.segments()

    built, weight_flags, freq_flags = [], [], []
    from_index = Segments.from_index.__func__
    Segments.from_index = classmethod(lambda cls, index, n: built.append(n) or from_index(cls, index, n))
    launch_epilogue = phi._epilogue_launch

    def epilogue_launch(*a):
        if a[8] is not None:  # the backward of gated_phi: are the norm weights' terms (∂L/∂cn) written?
            weight_flags.append(a[14] is not None)
        return launch_epilogue(*a)

    phi._epilogue_launch = epilogue_launch
    launch_bessel = basis._launch_bessel
    basis._launch_bessel = lambda *a: freq_flags.append(a[5] if len(a) > 5 else None) or launch_bessel(*a)

    failures = []

    def check(name, ok):
        print(("ok   " if ok else "FAIL ") + name)
        if not ok:
            failures.append(name)

    before = [p.requires_grad for p in model.parameters()]
    first = model(batch)
    second = model(batch)
    check("two calls on one graph build no CSR layout", built == [])
    check("same results on the reused layouts", torch.equal(first.forces, second.forces))
    check("inference: no gated Φ backward computes weight terms", weight_flags and not any(weight_flags))
    check("inference: the Bessel backward skips frequency sums", False in freq_flags and True not in freq_flags)
    check("inference: requires_grad restored", [p.requires_grad for p in model.parameters()] == before)
    check("inference: no weight gradient stored", all(p.grad is None for p in model.parameters()))

    model.train()
    out = model(batch, create_graph=True)
    (out.energy.sum() + (out.forces ** 2).sum()).backward()
    model.eval()
    check("training: weights get gradients", all(p.grad is not None for p in model.atom_embedding.parameters()))
    print("all Triton-path checks passed" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
