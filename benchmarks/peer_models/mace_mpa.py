"""MACE-MPA-0 (medium): higher-order equivariant message passing (MACE, Batatia et al. 2022/2023),
2 interactions, 128x0e+128x1o hidden features, body order 4 (correlation 3), trained on MPtrj + sAlex;
published size 9,063,204 parameters.

Weights: RANDOM (seeded), at the published architecture. The published checkpoint is downloaded at
run time by mace.calculators.mace_mp(model="medium-mpa-0") from GitHub releases, which is not possible
here. The module is built with mace's own ScaleShiftMACE class and run through mace's own
MACECalculator (MACECalculator(models=module, default_dtype=...)), i.e. the code path users run
after mace_mp() has loaded the checkpoint. Speed and memory are the same as with the published weights.
The energy values are not: they are meaningless here.

Hyperparameter sources:
- ACEsuit/mace-foundations mace_mp_0b3/mace-mp0-b3.sh (the MP-0b3 medium training command; MPA-0 is
  the same medium model trained on MPtrj+sAlex): model MACE/ScaleShiftMACE with
  interaction_first=RealAgnosticDensityInteractionBlock, interaction=RealAgnosticDensityResidualInteractionBlock,
  num_interactions=2, correlation=3, max_ell=3, r_max=6.0, max_L=1 + num_channels=128 (=128x0e+128x1o),
  num_radial_basis=10, MLP_irreps=16x0e, pair_repulsion (ZBL), distance_transform=Agnesi,
  default_dtype=float64; run_train defaults: num_cutoff_basis=5, radial_MLP=[64,64,64], gate=silu.
- apax-hub/apax PR #558 (a parity port of the checkpoint): "MACE-MPA-0 medium (Density variants + ZBL +
  AgnesiTransform)".
- 89 elements Z=1..83, 89..94 (mace-foundations mace_omat/*.sh atomic_numbers; the MP/MPA 89-element table).
- use_reduced_cg=False: the checkpoint was written by mace 0.3.9, before reduced CG existed (loading it
  in mace 0.3.16 keeps the full-CG symmetric contraction). The parameter count is the same either way.
- Check: this build has exactly 9,063,204 parameters, equal to matbench-discovery models/mace/mace-mpa-0.yml
  model_params. The Residual-block variant gives 4,688,656, which is MACE-MP-0 medium's count.
Placeholders that do not change cost: atomic energies (E0s), scale/shift, avg_num_neighbors
(the Density blocks normalise by a learned density, not by it).
"""
NAME = "MACE-MPA-0 (medium)"
PACKAGE = "mace-torch==0.3.16"
PYTHON = "3.11"
REQUIREMENTS = [
    "torch==2.13.0",
    "mace-torch==0.3.16",  # pins e3nn==0.4.4; pulls ase, matscipy, torch-ema, ... from PyPI
]
PUBLISHED_PARAMS = 9_063_204  # matbench-discovery models/mace/mace-mpa-0.yml, model_params: 9063204
LEADERBOARD_MODEL = "MACE-MPA-0"

R_MAX = 6.0
ATOMIC_NUMBERS = list(range(1, 84)) + list(range(89, 95))  # 89 elements


def build(dtype: str = "float32", device: str = "cpu"):
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    # `import mace` first: it sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, without which e3nn 0.4.4's
    # import (torch.load of its constants.pt) fails under torch>=2.6.
    import mace  # noqa: F401
    import numpy as np
    import torch
    from e3nn import o3
    from mace.calculators import MACECalculator
    from mace.modules import ScaleShiftMACE, interaction_classes

    # The published checkpoint is float64 (trained with --default_dtype float64). mace_mp() loads it
    # and MACECalculator converts it to default_dtype, so build in float64 and let the calculator convert.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = ScaleShiftMACE(
            r_max=R_MAX,
            num_bessel=10,
            num_polynomial_cutoff=5,
            max_ell=3,
            interaction_cls=interaction_classes["RealAgnosticDensityResidualInteractionBlock"],
            interaction_cls_first=interaction_classes["RealAgnosticDensityInteractionBlock"],
            num_interactions=2,
            num_elements=len(ATOMIC_NUMBERS),
            hidden_irreps=o3.Irreps("128x0e+128x1o"),
            MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=np.zeros(len(ATOMIC_NUMBERS)),
            avg_num_neighbors=60.0,
            atomic_numbers=ATOMIC_NUMBERS,
            correlation=3,
            gate=torch.nn.functional.silu,
            pair_repulsion=True,
            distance_transform="Agnesi",
            radial_MLP=[64, 64, 64],
            radial_type="bessel",
            use_reduced_cg=False,
            atomic_inter_scale=1.0,
            atomic_inter_shift=0.0,
        )
    finally:
        torch.set_default_dtype(prev)
    params = sum(p.numel() for p in model.parameters())
    calc = MACECalculator(models=model, device=device, default_dtype=dtype)
    info = {
        "params": int(params),
        "weights": "random",
        "note": "published architecture (ScaleShiftMACE, Density blocks, ZBL, Agnesi, r_max 6.0) with seeded "
        "random weights; mace_mp(model='medium-mpa-0') downloads the checkpoint at run time, which is impossible "
        "offline. Calculator: mace.calculators.MACECalculator, e3nn backend (no cuEquivariance).",
    }
    return calc, info
