"""Make the training data of the bundled model: diverse structures labelled by CHGNet 0.3.0.

    pip install chgnet          # the CHGNet 0.3.0 weights ship in chgnet >= 0.3.1 wheels
    python examples/distill/make_data.py     # -> examples/distill/data/, ~35 min on 2 CPU cores

Each stage is written to ``data/stages/`` as soon as it is labelled; a rerun (after a crash or
a kill) reuses the finished stages and labels only what is missing.

Structures (all periodic, 2-64 atoms), over the ELEMENTS below:

1. Prototypes: every element as fcc, bcc, hcp, diamond and simple cubic; random pairs as
   rocksalt, CsCl, zincblende and wurtzite; fluorite AB2 and cubic perovskite ABO3; a few named
   anchors (NiO, MgO, NaCl, GaAs, ...). Each is scanned over 9 lattice scales (0.88-1.16 × a
   guess from covalent radii) with CHGNet; the lowest-energy scale is the prototype's
   "equilibrium", and scan points more than 1.5 eV/atom above it are dropped (compressions
   where the teacher itself extrapolates).
2. Around each equilibrium: supercells strained (volume ±10 %, shear ±4 %) and rattled
   (σ = 0.02-0.2 Å), plus two-element substitutions in supercells.
3. Random cells: 4-16 atoms of 1-3 elements at random positions (no pair closer than 0.75 of
   the sum of covalent radii) in random triclinic cells.
4. MD snapshots: CHGNet Langevin NVT at 300-1500 K, including 64-atom diamond Si.

Every structure is labelled by CHGNet 0.3.0 (energy eV, forces eV/Å, stress in ASE's sign
and eV/Å³, magnetic moments μB) and written as extended XYZ with the labels as calculator
results, so ``matris train`` reads them directly. Every structure carries ``family`` (its
prototype family, e.g. ``NaCl-rocksalt``; MD snapshots, strained, rattled and substituted
supercells keep the family of the prototype they started from), ``prototype`` (``rocksalt``,
``fcc``, ``random``, ...) and ``kind`` (``scan``, ``strained``, ``random``, ``md``) in its info.
A seeded 10 % of the families goes to test.extxyz whole: no held-out structure shares a
prototype family with a training one. The anchors (Si-diamond, Cu-fcc, NiO, MgO, NaCl, GaAs)
always stay in training: the model card's lattice constants are measured on them. So do the
families of ``previous_families.txt`` (the previous bundled model's training prototypes): the
held-out families are ones neither model has seen, so the two compare on the same split.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# CHGNet 0.3.x imports ExpCellFilter from ase.constraints, which ASE >= 3.25 moved to ase.filters.
import ase.constraints
import ase.filters
import numpy as np

for _name in ("ExpCellFilter", "FrechetCellFilter", "UnitCellFilter", "StrainFilter"):
    if not hasattr(ase.constraints, _name) and hasattr(ase.filters, _name):
        setattr(ase.constraints, _name, getattr(ase.filters, _name))

from ase import Atoms, units  # noqa: E402
from ase.build import bulk  # noqa: E402
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402
from ase.data import atomic_numbers, covalent_radii  # noqa: E402
from ase.io import write  # noqa: E402
from ase.md.langevin import Langevin  # noqa: E402
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution  # noqa: E402

from lattices import lattice_constants  # noqa: E402  (the same fit for the teacher and the student)

ELEMENTS = ("H Li Be B C N O F Na Mg Al Si P S Cl K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se "
            "Br Rb Sr Y Zr Nb Mo Ru Rh Pd Ag Cd In Sn Sb Te I Cs Ba La Hf Ta W Ir Pt Au Pb Bi").split()
METALS_AND_SEMI = [e for e in ELEMENTS if e not in ("H", "N", "O", "F", "Cl", "Br", "I")]
ANIONS = ("O", "S", "N", "F", "Cl", "Se", "P", "C", "B", "H", "Br", "I", "Te", "As", "Sb")
CATIONS = ("Li", "Na", "K", "Rb", "Cs", "Be", "Mg", "Ca", "Sr", "Ba", "Sc", "Y", "La", "Ti", "Zr", "Hf",
           "V", "Nb", "Ta", "Cr", "Mo", "W", "Mn", "Fe", "Co", "Ni", "Cu", "Zn", "Cd", "Al", "Ga", "In",
           "Sn", "Pb", "Bi", "Ag", "Pd", "Pt")


# named families that always stay in training (the model card's lattice constants are measured on
# them; Si-diamond and Cu-fcc are also among the element prototypes)
ANCHORS = (("NiO", "rocksalt", 4.17), ("MgO", "rocksalt", 4.21), ("NaCl", "rocksalt", 5.64),
           ("GaAs", "zincblende", 5.65))
ANCHOR_FAMILIES = {"Si-diamond", "Cu-fcc"} | {f"{f}-{k}" for f, k, _ in ANCHORS}


PREVIOUS_FAMILIES = Path(__file__).resolve().parent / "previous_families.txt"


def family_prototype(family: str) -> str:
    """``NaCl-rocksalt`` → ``rocksalt``; ``random-12`` → ``random``."""
    return "random" if family.startswith("random-") else family.rsplit("-", 1)[-1]


def radius(el: str) -> float:
    return float(covalent_radii[atomic_numbers[el]])


def prototypes(rng: np.random.Generator) -> list[tuple[str, Atoms]]:
    """(family, guessed structure) pairs; lattice constants from covalent radii."""
    out = []
    for el in METALS_AND_SEMI:  # molecular elements (H, N, O, halogens) only appear in compounds
        r = radius(el)
        out.append((f"{el}-fcc", bulk(el, "fcc", a=2 * np.sqrt(2) * r * 1.05)))
        out.append((f"{el}-bcc", bulk(el, "bcc", a=4 / np.sqrt(3) * r * 1.05)))
        out.append((f"{el}-hcp", bulk(el, "hcp", a=2 * r * 1.05, c=2 * r * 1.05 * 1.633)))
        out.append((f"{el}-diamond", bulk(el, "diamond", a=8 / np.sqrt(3) * r)))
        out.append((f"{el}-sc", bulk(el, "sc", a=2 * r * 1.05)))
    for kind in ("rocksalt", "cesiumchloride", "zincblende", "wurtzite"):
        for _ in range(70):
            a, b = rng.choice(CATIONS), rng.choice(ANIONS)
            d = (radius(a) + radius(b)) * 1.05
            if kind == "rocksalt":
                at = bulk(f"{a}{b}", kind, a=2 * d)
            elif kind == "cesiumchloride":
                at = bulk(f"{a}{b}", kind, a=2 * d / np.sqrt(3))
            elif kind == "zincblende":
                at = bulk(f"{a}{b}", kind, a=4 * d / np.sqrt(3))
            else:
                at = bulk(f"{a}{b}", kind, a=d * np.sqrt(8 / 3), c=d * np.sqrt(8 / 3) * 1.633)
            out.append((f"{a}{b}-{kind}", at))
    for _ in range(50):
        a, b = rng.choice(CATIONS), rng.choice(("O", "F", "S", "Cl", "H", "N"))
        d = (radius(a) + radius(b)) * 1.05
        out.append((f"{a}{b}2-fluorite", bulk(f"{a}{b}2", "fluorite", a=4 * d / np.sqrt(3))))
    for _ in range(50):
        a, b = rng.choice(CATIONS), rng.choice(CATIONS)
        x = rng.choice(("O", "O", "F", "N", "S"))
        d = (radius(b) + radius(x)) * 1.05
        at = Atoms(f"{a}{b}{x}3", scaled_positions=[[0, 0, 0], [0.5, 0.5, 0.5], [0.5, 0.5, 0], [0.5, 0, 0.5],
                                                     [0, 0.5, 0.5]], cell=np.eye(3) * 2 * d, pbc=True)
        out.append((f"{a}{b}{x}3-perovskite", at))
    for formula, kind, a in ANCHORS:
        out.append((f"{formula}-{kind}", bulk(formula, kind, a=a)))
    unique: dict[str, Atoms] = {}
    for fam, at in out:  # one family per name: a pair drawn twice is the same family
        unique.setdefault(fam, at)
    return list(unique.items())


def random_cell(rng: np.random.Generator) -> Atoms | None:
    n = int(rng.integers(4, 17))
    els = list(rng.choice(METALS_AND_SEMI + list(ANIONS[:6]), size=int(rng.integers(1, 4)), replace=False))
    symbols = [str(rng.choice(els)) for _ in range(n)]
    vol = sum(4 / 3 * np.pi * (radius(s) * 1.1) ** 3 for s in symbols) / 0.55
    cell = np.eye(3) + rng.uniform(-0.25, 0.25, (3, 3))
    cell *= (vol / abs(np.linalg.det(cell))) ** (1 / 3)
    pos = []
    for s in symbols:
        for _ in range(200):
            p = rng.uniform(0, 1, 3) @ cell
            ok = True
            for q, t in pos:
                dv = p - q
                frac = np.linalg.solve(cell.T, dv)
                dv = (frac - np.round(frac)) @ cell
                if np.linalg.norm(dv) < 0.75 * (radius(s) + radius(t)):
                    ok = False
                    break
            if ok:
                pos.append((p, s))
                break
        else:
            return None
    return Atoms([s for _, s in pos], positions=[p for p, _ in pos], cell=cell, pbc=True)


def supercell_to(atoms: Atoms, lo: int, hi: int, rng: np.random.Generator) -> Atoms:
    """A diagonal supercell with between lo and hi atoms (or the cell itself if already big)."""
    n = len(atoms)
    options = [(i, j, k) for i in (1, 2, 3) for j in (1, 2, 3) for k in (1, 2, 3) if lo <= n * i * j * k <= hi]
    if not options:
        return atoms.copy()
    return atoms.repeat(options[int(rng.integers(len(options)))])


def strain(atoms: Atoms, rng: np.random.Generator, vol: float = 0.10, shear: float = 0.04) -> Atoms:
    at = atoms.copy()
    eps = rng.uniform(-shear, shear, (3, 3))
    eps = (eps + eps.T) / 2 + np.eye(3) * ((1 + rng.uniform(-vol, vol)) ** (1 / 3) - 1)
    at.set_cell(at.cell[:] @ (np.eye(3) + eps), scale_atoms=True)
    return at


class Labeller:
    """CHGNet 0.3.0 on batches of structures; returns labelled Atoms (ASE units and signs)."""

    def __init__(self, batch_size: int = 24) -> None:
        from chgnet.model import CHGNet

        self.model = CHGNet.load(model_name="0.3.0", verbose=False)
        self.batch_size = batch_size
        self.calls = 0

    def __call__(self, frames: list[Atoms]) -> list[Atoms]:
        from pymatgen.io.ase import AseAtomsAdaptor

        frames = [a for a in frames if not dense(a)]
        out = []
        for i in range(0, len(frames), self.batch_size):
            chunk = frames[i:i + self.batch_size]
            structs = [AseAtomsAdaptor.get_structure(a) for a in chunk]
            preds = self.model.predict_structure(structs, task="efsm", batch_size=self.batch_size)
            preds = preds if isinstance(preds, list) else [preds]
            for a, p in zip(chunk, preds):
                b = a.copy()
                # CHGNet: e eV/atom, f eV/Å, s GPa with ASE's sign (positive = tensile), m μB.
                b.calc = SinglePointCalculator(
                    b, energy=float(p["e"]) * len(b), forces=np.asarray(p["f"], dtype=float),
                    stress=np.asarray(p["s"], dtype=float) * units.GPa, magmoms=np.asarray(p["m"], dtype=float))
                out.append(b)
            self.calls += len(chunk)
            if (i // self.batch_size) % 40 == 39:
                print(f"  labelled {i + len(chunk)}/{len(frames)}", flush=True)
        return out


def dense(a: Atoms, cutoff: float = 5.0, limit: float = 100.0) -> bool:
    """More than ``limit`` neighbours per atom within ``cutoff`` on average (CHGNet's graph
    would explode: its angle count grows with the square of that)."""
    return len(a) / a.get_volume() * 4 / 3 * np.pi * cutoff**3 > limit


def sane(a: Atoms) -> bool:
    """Drop labels CHGNet cannot be trusted on (atoms on top of each other, absurd forces)."""
    e = a.get_potential_energy() / len(a)
    return bool(np.isfinite(e) and -15 < e < 5 and np.abs(a.get_forces()).max() < 40)


def md_snapshots(atoms: Atoms, label: Labeller, temperature: float, steps: int, every: int,
                 seed: int) -> list[Atoms]:
    from chgnet.model.dynamics import CHGNetCalculator

    at = atoms.copy()
    at.calc = CHGNetCalculator(model=label.model, use_device="cpu")
    MaxwellBoltzmannDistribution(at, temperature_K=temperature, rng=np.random.default_rng(seed))
    dyn = Langevin(at, 2.0 * units.fs, temperature_K=temperature, friction=0.02,
                   rng=np.random.default_rng(seed + 1))
    frames = []
    for _ in range(steps // every):
        dyn.run(every)
        frames.append(Atoms(at.get_chemical_symbols(), positions=at.positions, cell=at.cell, pbc=True))
    return frames


def stage(path: Path, make) -> list[Atoms]:
    """The labelled frames of one stage: read from ``path`` if an earlier run finished it, else
    made, labelled and written (see :func:`write_frames`)."""
    from ase.io import read

    if path.exists():
        frames = read(path, ":")
        print(f"  reusing {path.name}: {len(frames)} structures", flush=True)
        return frames
    frames = make()
    write_frames(path, frames)
    return frames


def write_frames(path: Path, frames: list[Atoms]) -> None:
    """Extended XYZ written to a temporary name and renamed: a kill never leaves a half file."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp, frames, format="extxyz")
    tmp.replace(path)


def tag(frames: list[Atoms], kind: str) -> list[Atoms]:
    for a in frames:
        a.info["kind"] = kind
        a.info["prototype"] = family_prototype(a.info["family"])
    return frames


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-prototype", type=int, default=8, help="strained/rattled samples per prototype")
    p.add_argument("--random-cells", type=int, default=500)
    p.add_argument("--md-steps", type=int, default=150)
    p.add_argument("--md-runs", type=int, default=14, help="MD trajectories besides diamond Si")
    p.add_argument("--scan-window", type=float, default=1.5,
                   help="keep scan points at most this many eV/atom above the family's minimum")
    p.add_argument("--test-fraction", type=float, default=0.1)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    label = Labeller()
    t0 = time.time()
    stages = args.out / "stages"
    stages.mkdir(parents=True, exist_ok=True)

    # 1. volume scans of the prototypes
    protos = prototypes(rng)
    scales = np.linspace(0.88, 1.16, 9)

    def make_scan():
        scan = []
        for fam, at in protos:
            for s in scales:
                b = at.copy()
                b.set_cell(at.cell[:] * s, scale_atoms=True)
                b.info["family"] = fam
                scan.append(b)
        return tag([a for a in label(scan) if sane(a)], "scan")

    scan = stage(stages / "1-scan.extxyz", make_scan)
    equilibria, samples = [], []
    for fam, _ in protos:
        group = [a for a in scan if a.info["family"] == fam]
        if not group:
            continue
        energies = [a.get_potential_energy() / len(a) for a in group]
        k = int(np.argmin(energies))
        samples += [a for a, e in zip(group, energies) if e - energies[k] <= args.scan_window]
        eq = group[k].copy()
        eq.calc = None
        equilibria.append(eq)
    print(f"[{time.time() - t0:5.0f} s] {len(protos)} prototypes scanned, {len(samples)} kept", flush=True)

    # 2. strained, rattled and substituted supercells around each equilibrium
    def make_around():
        rng = np.random.default_rng([args.seed, 2])  # one stream per stage: a resumed run makes the same data
        around = []
        for eq in equilibria:
            for j in range(args.per_prototype):
                b = supercell_to(eq, 8, 40, rng) if j % 2 else eq.copy()
                b = strain(b, rng)
                b.positions += rng.normal(0, rng.choice((0.02, 0.05, 0.1, 0.2)), b.positions.shape)
                if j == args.per_prototype - 1 and len(b) >= 4:
                    syms = b.get_chemical_symbols()
                    for idx in rng.choice(len(b), size=max(1, len(b) // 4), replace=False):
                        syms[idx] = str(rng.choice(METALS_AND_SEMI))
                    b.set_chemical_symbols(syms)
                b.info["family"] = eq.info["family"]
                around.append(b)
        return tag([a for a in label(around) if sane(a)], "strained")

    around = stage(stages / "2-strained.extxyz", make_around)
    samples += around
    print(f"[{time.time() - t0:5.0f} s] {len(around)} strained/rattled supercells", flush=True)

    # 3. random cells
    def make_random():
        rng = np.random.default_rng([args.seed, 3])
        randoms = []
        while len(randoms) < args.random_cells:
            b = random_cell(rng)
            if b is not None:
                b.info["family"] = f"random-{len(randoms)}"
                randoms.append(b)
        return tag([a for a in label(randoms) if sane(a)], "random")

    randoms = stage(stages / "3-random.extxyz", make_random)
    samples += randoms
    print(f"[{time.time() - t0:5.0f} s] {len(randoms)} random cells", flush=True)

    # 4. MD snapshots: diamond Si 64 (the bundled model's MD check) and a spread of others. The
    # frames keep the family of the structure they started from, so a held-out family's MD stays
    # out of training.
    def make_md():
        rng = np.random.default_rng([args.seed, 4])
        md_inputs = [("Si-diamond", bulk("Si", "diamond", a=5.47, cubic=True).repeat(2), t) for t in (300, 900)]
        by_family = {eq.info["family"]: eq for eq in equilibria}
        picks = rng.choice(sorted(by_family), size=min(args.md_runs, len(by_family)), replace=False)
        for fam in picks:
            md_inputs.append((fam, supercell_to(by_family[fam], 16, 32, rng), float(rng.choice((300, 800, 1500)))))
        md = []
        for k, (fam, at, temp) in enumerate(md_inputs):
            try:
                frames = md_snapshots(at, label, temp, args.md_steps, 10, args.seed + 100 * k)
            except Exception as exc:  # noqa: BLE001 - an unstable CHGNet trajectory is skipped, not fatal
                print(f"  MD of {fam} at {temp} K failed: {exc}")
                continue
            for f in frames:
                f.info["family"] = fam
            md += frames
            print(f"  MD {k + 1}/{len(md_inputs)} ({fam}, {temp:.0f} K) done", flush=True)
        return tag([a for a in label(md) if sane(a)], "md")

    md = stage(stages / "4-md.extxyz", make_md)
    samples += md
    print(f"[{time.time() - t0:5.0f} s] {len(md)} MD snapshots", flush=True)

    # split by family: every structure of a held-out family (its scan, strained supercells and MD)
    # is in test, none in train. The anchors stay in training, and so do the prototype families
    # the previous bundled model was trained on, so both models are measured on families neither saw.
    split_rng = np.random.default_rng(args.seed + 1)
    families = sorted({a.info["family"] for a in samples})
    previous = {line.strip() for line in PREVIOUS_FAMILIES.read_text().splitlines()
                if line.strip()[:1] not in ("", "#")}
    eligible = sorted(set(families) - ANCHOR_FAMILIES - previous)
    test_fams = set(split_rng.choice(eligible, size=int(round(args.test_fraction * len(families))), replace=False))
    train = [a for a in samples if a.info["family"] not in test_fams]
    test = [a for a in samples if a.info["family"] in test_fams]
    assert not {a.info["family"] for a in train} & {a.info["family"] for a in test}
    order = split_rng.permutation(len(train))
    train = [train[i] for i in order]
    for name, frames in (("train", train), ("test", test)):
        write_frames(args.out / f"{name}.extxyz", frames)
    summary = {
        "teacher": "CHGNet 0.3.0 (chgnet package, CHGNet.load(model_name='0.3.0'))",
        "structures": {"train": len(train), "test": len(test)},
        "atoms": {"train": int(sum(len(a) for a in train)), "test": int(sum(len(a) for a in test))},
        "families": {"train": len({a.info["family"] for a in train}), "test": len(test_fams)},
        "by_kind": {k: {"train": sum(a.info["kind"] == k for a in train),
                        "test": sum(a.info["kind"] == k for a in test)}
                    for k in ("scan", "strained", "random", "md")},
        "elements": sorted({s for a in samples for s in a.get_chemical_symbols()}),
        "lattice_constants_A": lattice_constants(
            lambda frames: [a.get_potential_energy() for a in label([f.copy() for f in frames])]),
        "seconds": round(time.time() - t0, 1),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    # the split itself, committed next to this script (tests/test_bundled.py checks the held-out fixture against it)
    split = {"seed": args.seed, "test_families": sorted(test_fams),
             "train_families": sorted({a.info["family"] for a in train})}
    (Path(__file__).resolve().parent / "split.json").write_text(json.dumps(split, indent=0) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
