"""MatRIS-10M-OAM run by the official MatRIS 1.0.0 code (PyPI ``matris==1.0.0``, the authors' own
implementation of the same model this repository reimplements), through its own ASE calculator
``matris.applications.MatRISCalculator``, exactly as a user runs it.

Architecture: 10 interaction blocks of width 128 (node, edge and three-body features), Bessel radial
basis (7 terms, envelope exponent 8), Fourier three-body basis (7 terms, learnable), GateMLP with SiLU
and LayerNorm, Linear layers without bias, energy head (256, 128, 128), pairwise cutoff 6 Å,
three-body cutoff 4.5 Å, per-element reference energies for 94 elements: 10,443,505 parameters
(10,443,411 without the reference energies, the count the official code prints while loading).

Weights: random. ``MatRIS.load`` of a published model name downloads the checkpoint from GitHub
at run time, which cannot work here, and the package ships no weights and no config files for its
seven published models (each checkpoint carries its own ``config``). So build() constructs the
architecture with the official package's own classes (``matris.model.model.MatRIS`` with the
official constructor's random initialisation, seed 0, plus ``matris.model.reference_energy.AtomRef``
of 94 elements as ``MatRIS.from_dict`` builds it for a published checkpoint), saves it to a
temporary file in the published checkpoint layout (``{"config", "state_dict"}``) and loads that file
through ``MatRISCalculator(model=path, ...)``: from there on the code path is the one users run with
the published weights. Sources of the hyperparameters: ``model_params: 10443505``,
``n_layers: 10``, ``graph_construction_radius: 6.0`` and ``three_body_cutoff: 4.5`` in
matbench-discovery ``models/matris/matris-10m-oam.yml``; the rest is the config stored in the
published checkpoints as recorded in this repository (``MatRISConfig.published_10m`` in
matris/model/config.py); the official code builds exactly 10,443,505 parameters from it.

Settings: ``mode="torch"`` (eager PyTorch) by default; ``mode="fast"`` (the calculator's default)
is the same eager code on CPU and differs only on CUDA (Warp neighbour lists from
``nvalchemi-toolkit-ops``, ``load_inline`` CUDA operators built with ``ninja``, ``torch.compile``).
``activation_checkpoint=False`` (the calculator's default is ``True``, which on CPU recomputes the
forward pass for forces and stress; ``False`` is the fastest CPU setting). The calculator's stress
is a 3x3 array (eV/Å³, ASE sign); ``Atoms.get_stress`` converts it to Voigt form.

float32 only: the official graph converter stores fractional coordinates and the lattice as float32
tensors (matris/graph/converter.py), so a float64 model (``model.double()``) fails in its first
Linear layer ("expected m1 and m2 to have the same dtype"); build() raises ValueError for float64.

Venv: Python 3.12 (the package requires >= 3.12); ``torch==2.13.0`` for 3.12 comes from PyPI as the
CUDA 13 build (several GB, runs on CPU too).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

NAME = "MatRIS-10M-OAM (official 1.0.0 code)"
PACKAGE = "matris==1.0.0"
PYTHON = "3.12"
REQUIREMENTS = ["torch==2.13.0", "matris==1.0.0"]  # matris pulls ase, numpy, pymatgen, nvalchemi-toolkit-ops, ninja
# matbench-discovery models/matris/matris-10m-oam.yml, model_params (with the 94 reference energies)
PUBLISHED_PARAMS = 10_443_505
LEADERBOARD_MODEL = "MatRIS-10M-OAM"

# The published MatRIS-10M config (checkpoint ``config`` entry; see the module docstring).
CONFIG = dict(
    num_layers=10, node_feat_dim=128, edge_feat_dim=128, three_body_feat_dim=128,
    mlp_hidden_dims=[256, 128, 128], dropout=0.0, use_bias=False, distance_expansion="Bessel",
    three_body_expansion="Fourier", num_radial=7, num_angular=7, max_l=4, max_n=4, envelope_exponent=8,
    graph_conv_mlp="GateMLP", activation_type="silu", norm_type="layer", pairwise_cutoff=6.0,
    three_body_cutoff=4.5, use_smoothed_for_delta_edge=False, learnable_basis=True, is_intensive=True,
    is_conservation=True,
)


def build(dtype: str = "float32", device: str = "cpu", mode: str = "torch", seed: int = 0):
    """-> (calculator, info): the official ``MatRISCalculator`` on random MatRIS-10M weights.

    ``mode``: "torch" (default) or "fast" (the official calculator's default; same code on CPU).
    ``activation_checkpoint`` is False. The official code's prints while loading go to stderr.
    """
    import torch

    dtype = str(dtype).removeprefix("torch.")
    if dtype == "float64":
        raise ValueError("the official MatRIS code has no float64 path: its graph converter builds float32 "
                         "geometry (matris/graph/converter.py), so a float64 model fails with a dtype mismatch")
    if dtype != "float32":
        raise ValueError(f"dtype must be 'float32', got {dtype!r}")

    from matris.applications import MatRISCalculator
    from matris.model.model import MatRIS
    from matris.model.reference_energy import AtomRef

    with contextlib.redirect_stdout(sys.stderr), tempfile.TemporaryDirectory() as tmp:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = MatRIS(**CONFIG)
            model.reference_energy = AtomRef(is_intensive=CONFIG["is_intensive"], max_num_elements=94)
        path = os.path.join(tmp, "MatRIS_10M_OAM_random.pth.tar")
        torch.save({"config": {**CONFIG, "reference_energy": None}, "state_dict": model.state_dict()}, path)
        calc = MatRISCalculator(model=path, task="efs", device=device, mode=mode, activation_checkpoint=False)
    info = {"params": calc.model.get_params(), "weights": "random",
            "note": f"official matris 1.0.0 MatRISCalculator, mode={mode!r}, activation_checkpoint=False, "
                    f"random weights (seed {seed}) at the published MatRIS-10M config; float32 only"}
    return calc, info
