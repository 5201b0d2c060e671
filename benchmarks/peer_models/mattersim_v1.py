"""MatterSim v1 5M (Yang et al., arXiv:2405.04967; package mattersim 1.2.3, checkpoint mattersim-v1.0.0-5M).

Architecture: the package's M3GNet (mattersim.forcefield.m3gnet.m3gnet.M3Gnet): 4 main blocks of
three-body-gated edge updates and gated atom updates, 256 hidden units, 4 smooth-Bessel radial bases
(max_n 4) and spherical bases up to max_l 4, a 5.0 A graph cutoff and a 4.0 A three-body cutoff, a one-hot
embedding of 95 species (max_z 94), a gated MLP energy head and a per-species scale/shift; forces and stress
are gradients of the energy with respect to positions and a strain. Published size 4,549,142 parameters.

Weights: RANDOM, at the published hyperparameters. The wheel ships no checkpoint: `Potential.from_checkpoint
("mattersim-v1.0.0-5M.pth")` downloads it from GitHub at run time (mattersim/utils/download_utils.py),
impossible here. The 5M and 1M checkpoints differ only in `units` (256 vs 128): matbench-discovery
models/mattersim/mattersim-v1-5M.yml gives "units: 256", "graph_construction_radius: 5.0" and
"model_params: 4_549_142"; every other hyperparameter is the M3Gnet default of the package (num_blocks 4,
max_l 4, max_n 4, cutoff 5.0, threebody_cutoff 4.0, max_z 94), which at units 256 gives 4,548,930
parameters (-0.005 % of the published count; at units 128 it would be 1.16 M). The per-species energy
scale/shift buffers stay at 1/0 (the checkpoint's values do not change the cost).

The model is wrapped the way `Potential.from_checkpoint` wraps a loaded one (`Potential(model, device=...)`,
which also builds an Adam optimizer and an EMA shadow copy of the weights, then eval()) and handed to the
package's `MatterSimCalculator(potential=..., device=...)`: each call builds the graph on the CPU (pymatgen
find_points_in_spheres + the package's compiled three-body indexer), batches it with torch_geometric, and
runs one forward + one autograd pass for forces and stress.
"""
import torch

NAME = "MatterSim v1 5M"
PACKAGE = "mattersim==1.2.3"
PYTHON = "3.11"
# mattersim 1.2.3 declares torchaudio, torchvision, wandb, atomate2, mp-api, phonopy, ... that the model and
# calculator never import; installed --no-deps, plus exactly what `mattersim.forcefield` imports at run time.
REQUIREMENTS = [
    "torch==2.13.0",
    "--no-deps mattersim==1.2.3",
    "ase>=3.23.0", "numpy>=2.0.0", "e3nn>=0.5.0", "torch_runstats>=0.2.0", "torch-ema>=0.3",
    "torch_geometric>=2.5.3", "torchmetrics>=0.10.0", "deprecated", "loguru", "requests",
    "scikit-learn", "pymatgen", "opt_einsum_fx",
]
# matbench-discovery models/mattersim/mattersim-v1-5M.yml: "model_params: 4_549_142"
PUBLISHED_PARAMS = 4_549_142
LEADERBOARD_MODEL = "MatterSim v1 5M"

# the published MatterSim v1 5M hyperparameters (see the module docstring)
HYPERPARAMS = dict(num_blocks=4, units=256, max_l=4, max_n=4, cutoff=5.0, threebody_cutoff=4.0, max_z=94)


def build(dtype: str = "float32", device: str = "cpu", seed: int = 0):
    """-> (MatterSimCalculator, info)."""
    if dtype != "float32":
        raise ValueError(
            f"dtype {dtype!r}: MatterSim runs in float32 only. Its graph builder makes positions, cell and "
            "pbc offsets with torch.FloatTensor (mattersim/datasets/utils/convertor.py), and M3Gnet.forward "
            "casts pbc_offsets and the one-hot species to .float() (mattersim/forcefield/m3gnet/m3gnet.py)."
        )
    from mattersim.forcefield import MatterSimCalculator, Potential
    from mattersim.forcefield.m3gnet.m3gnet import M3Gnet

    with torch.random.fork_rng(devices=[]):  # the same random weights on every build, global RNG untouched
        torch.manual_seed(seed)
        model = M3Gnet(device=device, **HYPERPARAMS).to(device)
    model.eval()
    potential = Potential(model, device=device)
    potential.eval()
    calc = MatterSimCalculator(potential=potential, device=device)
    info = {
        "params": sum(p.numel() for p in model.parameters()),
        "weights": "random",
        "note": (
            "mattersim M3Gnet at the v1.0.0-5M hyperparameters (units 256, 4 blocks, cutoff 5.0 A, "
            "three-body 4.0 A), random init (the checkpoint is a GitHub download); float32; graph built "
            "on the CPU every call; the Potential keeps an EMA copy of the weights as from_checkpoint does"
        ),
    }
    return calc, info
