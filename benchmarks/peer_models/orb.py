"""ORB v3 conservative, infinite neighbours (orb-v3-conservative-inf; Rhodes et al. 2025, arXiv:2504.06231).

Architecture: an attention-gated GNS message-passing network (5 layers, latent 256, node/edge MLPs 2 x 1024,
RMS norm, SiLU), 8 Bessel radial bases on a 6 A cutoff times l<=3 spherical harmonics per edge, ZBL pair
repulsion, an energy head and a confidence head; forces and stress are gradients of the energy
(ConservativeForcefieldRegressor). Published size 25,510,582 parameters.

Weights: RANDOM, at the published hyperparameters. The package's loaders
(`orb_models.forcefield.pretrained.orb_v3_conservative_inf_mpa` / `_inf_omat`) fetch the checkpoint from
S3 at run time, which is impossible here; the mpa and omat checkpoints share one architecture, so the
model is built with the package's own `orb_v3_conservative_architecture()` and the same
`SystemConfig(radius=6.0, max_num_neighbors=120)` those loaders use, then prepared the way their
`load_model()` does it (set_torch_precision, .to(dtype), .to(device), eval, parameters frozen) minus the
`load_state_dict`. Every hyperparameter comes from orb_models/forcefield/pretrained.py of orb-models 0.5.5
(the defaults of `orb_v3_conservative_architecture` and the `orb_v3_conservative_inf_*` functions).

The calculator is the package's `ORBCalculator` with its defaults: conservative forces/stress, the
edge method the package picks (scipy KDTree on CPU; brute-force kNN on GPU, since cuML is not installed).
"""
import torch

NAME = "ORB v3 conservative-inf"
PACKAGE = "orb-models==0.5.5"
PYTHON = "3.11"
REQUIREMENTS = ["torch==2.13.0", "orb-models==0.5.5"]  # pulls ase, scipy, dm-tree==0.1.8, cached_path
# matbench-discovery models/orb/orb-v3.yml (checkpoint orb-v3-conservative-inf-mpa-20250404):
# "model_params: 25,510,582"; the model built here counts exactly the same.
PUBLISHED_PARAMS = 25_510_582
LEADERBOARD_MODEL = "ORB v3"

# our dtype name -> the package's `precision` argument ("float32" is the package default, float32-high)
_PRECISION = {
    "float32": "float32-high",
    "float32-high": "float32-high",
    "float32-highest": "float32-highest",
    "float64": "float64",
}


def build(dtype: str = "float32", device: str = "cpu", compile: bool = False):
    """-> (ORBCalculator, info). `compile=True` does what the package's loaders do by default on CPU and
    CUDA: `model.compile(mode="default", dynamic=True)` on the GNS backbone (needs a C++ compiler, and
    Triton on CUDA; the first calls then compile)."""
    from orb_models.forcefield.atomic_system import SystemConfig
    from orb_models.forcefield.calculator import ORBCalculator
    from orb_models.forcefield.pretrained import orb_v3_conservative_architecture
    from orb_models.utils import set_torch_precision

    if dtype not in _PRECISION:
        raise ValueError(f"dtype {dtype!r}: orb-models offers {sorted(_PRECISION)}")
    precision = _PRECISION[dtype]
    device = torch.device(device)

    # the same random weights on every build and for every dtype (initialised in float32, then cast),
    # the global RNG untouched
    torch.set_default_dtype(torch.float32)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = orb_v3_conservative_architecture(
            device="cpu", system_config=SystemConfig(radius=6.0, max_num_neighbors=120)
        )
    # as orb_models.forcefield.pretrained.load_model, without loading a checkpoint. NB: this sets the
    # process-wide torch default dtype (and, for float32-*, torch.set_float32_matmul_precision).
    torch_dtype = set_torch_precision(precision)
    model = model.to(torch_dtype).to(device).train(False)
    for p in model.parameters():
        p.requires_grad = False
    if compile:
        model.compile(mode="default", dynamic=True)

    calc = ORBCalculator(model, device=device)
    info = {
        "params": sum(p.numel() for p in model.parameters()),
        "weights": "random",
        "note": (
            f"orb_v3_conservative_architecture() with random init, seed 0 (the checkpoint is an S3 download); "
            f"precision={precision}, radius 6.0 A, max_num_neighbors 120, conservative forces/stress, "
            f"{'torch.compile(dynamic=True)' if compile else 'eager (package default would compile)'}"
        ),
    }
    return calc, info
