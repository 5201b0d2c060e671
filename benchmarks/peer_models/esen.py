"""eSEN-30M-OAM (FAIR at Meta, arXiv:2502.12147): equivariant Smooth Energy Network, an eSCN-style
SO(2)-convolution message-passing potential with conservative forces and stress (both by autograd of
the energy); published size 30,161,153 parameters.

Weights: RANDOM, at the published hyperparameters. The published checkpoint (esen_30m_oam.pt on
HuggingFace, fairchem/OMAT24) is gated and downloaded at run time, and it is a fairchem-core 1.x
checkpoint (eSEN_Backbone, fairchem.core.models.esen, removed from fairchem in May 2025) that 2.x does
not load. Here the architecture is fairchem-core 2.x's eSEN implementation (eSCNMDBackbone +
MLP_EFS_Head, the class fairchem 2.x ships the OMol25/OC25/ODAC25 eSEN checkpoints with), saved to a
temporary inference checkpoint and loaded through MLIPPredictUnit into FAIRChemCalculator(task_name=
"omat"), the path a user's local eSEN checkpoint takes in fairchem 2.x.

Hyperparameters and their sources:
- cutoff 6.0 Å, no neighbour limit (max_neighbors .inf): matbench-discovery models/eSEN/eSEN-30m-oam.yml
  (graph_construction_radius, max_neighbors; "table 5 / sec. 5.3 in arXiv:2502.12147"); 2.x takes a
  finite limit, set here to MAX_NEIGHBORS (never reached at 6 Å in crystals).
- lmax 3, mmax 2, 10 layers, sphere/hidden/edge channels 128, 64 Gaussian distance basis, 100
  elements, rms_norm_sh, gate activation, spectral feed-forward, MLP energy head: the only setting of
  the fairchem 1.x eSEN_Backbone + esen_mlp_efs_head (fairchem commit 518d0ea, "eSEN code release")
  whose parameter count equals the published model_params 30_161_153 exactly (matbench-discovery
  yml); searched over lmax 2-6, 4-12 layers, 64/128/512 basis, gate/s2, spectral/grid.
- fairchem 2.x's backbone adds a charge/spin mixing layer, Linear(256, 128) (32,896 parameters, plus
  128 fixed ones), absent in 1.x; so the built model counts 30,194,049 trainable parameters (+0.11 %).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

NAME = "eSEN-30M-OAM"
PACKAGE = "fairchem-core==2.24.0"
PYTHON = "3.11"
REQUIREMENTS = ["torch==2.13.0", "fairchem-core==2.24.0"]
PUBLISHED_PARAMS = 30_161_153  # matbench-discovery models/eSEN/eSEN-30m-oam.yml, model_params
LEADERBOARD_MODEL = "eSEN-30M-OAM"

TASK = "omat"  # the FAIRChemCalculator task_name (the head's dataset)
MAX_NEIGHBORS = 300  # fairchem 2.x default; published: no limit

BACKBONE = dict(
    model="fairchem.core.models.uma.escn_md.eSCNMDBackbone",
    max_num_elements=100,
    sphere_channels=128,
    lmax=3,
    mmax=2,
    otf_graph=True,
    max_neighbors=MAX_NEIGHBORS,
    cutoff=6.0,
    edge_channels=128,
    distance_function="gaussian",
    num_distance_basis=64,
    direct_forces=False,  # conservative: forces and stress by autograd of the energy
    regress_forces=True,
    regress_stress=True,
    num_layers=10,
    hidden_channels=128,
    norm_type="rms_norm_sh",
    act_type="gate",
    ff_type="spectral",
    use_dataset_embedding=False,
)
HEADS = {
    "efs": {
        "module": "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
        "prefix": TASK,
        "wrap_property": True,
    }
}


def _task(prop: str, level: str, dim: list[int]) -> dict:
    return {
        "_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task",
        "name": f"{TASK}_{prop}",
        "level": level,
        "property": prop,
        "out_spec": {
            "_target_": "fairchem.core.units.mlip_unit.mlip_unit.OutputSpec",
            "dim": dim,
            "dtype": "float32",
        },
        "normalizer": {
            "_target_": "fairchem.core.modules.normalization.normalizer.Normalizer",
            "mean": 0.0,
            "rmsd": 1.0,
        },
        "datasets": [TASK],
    }


def _write_checkpoint(path: str, seed: int = 0) -> int:
    """Build the model with random weights and save it as a fairchem 2.x inference checkpoint."""
    import torch
    from fairchem.core.models.base import HydraModel
    from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint

    model_config = {
        "_target_": "fairchem.core.models.base.HydraModel",
        "backbone": dict(BACKBONE),
        "heads": HEADS,
        "pass_through_head_outputs": True,
        "otf_graph": True,
    }
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = HydraModel(
            backbone=dict(BACKBONE), heads=HEADS, pass_through_head_outputs=True
        )
    ema = torch.optim.swa_utils.AveragedModel(model)
    ckpt = MLIPInferenceCheckpoint(
        model_config=model_config,
        model_state_dict={},
        ema_state_dict=ema.state_dict(),
        tasks_config=[
            _task("energy", "system", [1]),
            _task("forces", "atom", [3]),
            _task("stress", "system", [1, 9]),
        ],
    )
    torch.save(ckpt, path)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build(dtype: str = "float32", device: str = "cpu"):
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    from fairchem.core import FAIRChemCalculator
    from fairchem.core.units.mlip_unit import MLIPPredictUnit
    from fairchem.core.units.mlip_unit.api.inference import InferenceSettings

    tmp = tempfile.mkdtemp(prefix="esen30m_")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    path = os.path.join(tmp, "esen_30m_oam_random.pt")
    _write_checkpoint(path)

    # fairchem 2.x's "default" preset minus torch.compile and TF32: eager, full precision,
    # no activation checkpointing, internal (on-the-fly) graph generation version 2.
    settings = InferenceSettings(
        tf32=False,
        activation_checkpointing=False,
        merge_mole=False,
        compile=False,
        external_graph_gen=False,
        internal_graph_gen_version=2,
        base_precision_dtype=dtype,
    )
    unit = MLIPPredictUnit(path, device=device, inference_settings=settings)
    calc = FAIRChemCalculator(unit, task_name=TASK)
    model = unit.model.module
    params = sum(p.numel() for p in model.parameters())
    fixed = sum(  # the fixed (non-trained) charge/spin positional-embedding frequencies
        p.numel()
        for n, p in model.named_parameters()
        if n.endswith(("charge_embedding.W", "spin_embedding.W"))
    )
    trainable = params - fixed
    info = {
        "params": trainable,
        "weights": "random",
        "note": (
            f"fairchem-core 2.x eSCNMDBackbone+MLP_EFS_Head at eSEN-30M-OAM hyperparameters, random "
            f"weights (published checkpoint gated, and a 1.x checkpoint); conservative E/F/S by "
            f"autograd; task '{TASK}'; cutoff 6 A, max_neighbors {MAX_NEIGHBORS}; eager, no compile, "
            f"no tf32, no activation checkpointing; {fixed} fixed charge/spin embedding "
            f"values not counted; includes 2.x's charge/spin mixing Linear (32,896 params) that 1.x "
            f"eSEN lacks"
        ),
    }
    return calc, info
