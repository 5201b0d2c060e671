"""SevenNet-MF-ompa (Kim et al., JACS 2025, doi:10.1021/jacs.4c14455; package sevenn 0.13.0).

Architecture: a NequIP-style E(3)-equivariant message-passing network, 5 interaction blocks with O(3)
(parity) features up to l=3 (irreps 128x0e -> 128x0e+64x1o+32x2e+32x3o -> ... -> 128x0e), "nequip"
self-connections, 8 Bessel radial bases with an XPLOR cutoff (on 5.5 A, cutoff 6.0 A), radial MLPs
8-64-64, 119 "universal" element types, and multi-fidelity ("modal") linear layers for two fidelities
(mpa = MPtrj+sAlex, omat24) in the self-interactions and the output block; forces and stress are
gradients of the energy with respect to the edge vectors. Published size 25,734,966 parameters.

Weights: RANDOM, at the published hyperparameters. The sevenn wheel ships only the SevenNet-0, -l3i5 and
-MF-0 checkpoints; '7net-mf-ompa' (and '7net-omni') are GitHub-release downloads at run time
(sevenn/_const.py CHECKPOINT_DOWNLOAD_LINKS), impossible here. The model is built with the package's own
`sevenn.model_build.build_E3_equivariant_model` from the `model:` section of the preset shipped in the
package, sevenn/presets/mf_ompa_fine_tune.yaml ("parameters of SevenNet-MF-ompa, should not be changed"),
identical to matbench-discovery models/sevennet/sevennet-mf-ompa/hyperparams.yaml, completed by
`sevenn.parse_input.init_model_config`. What the checkpoint carries as data statistics is set to
placeholders that do not change the cost: conv_denominator (the average neighbour count of the training
set) 40.0, per-element energy shift -5.0 (modal-wise), scale 1.5.

Calculator: the package's `SevenNetCalculator(model, file_type='model_instance', modal='mpa')`, which is
how the leaderboard entry was evaluated (modal 'mpa'). The graph (matscipy neighbour list) is built on the
CPU in numpy at every call and cast to float32 (sevenn.util.dtype_correct), then moved to the device.
"""
import os

import torch

NAME = "SevenNet-MF-ompa"
PACKAGE = "sevenn==0.13.0"
PYTHON = "3.11"
# sevenn pulls e3nn 0.6.0, torch_geometric, matscipy, ase, scikit-learn, pandas, ...
REQUIREMENTS = ["torch==2.13.0", "sevenn==0.13.0"]
# matbench-discovery models/sevennet/sevennet-mf-ompa.yml: "model_params: 25_734_966". The model built here
# has 25,735,090 parameters (all nn.Parameters); the published figure counts the trained ones: it
# leaves out the 119 fixed per-element scales and the 5 fixed convolution denominators (119 + 5 = 124),
# and keeps the 2 x 119 modal-wise shifts, which were trained (train_shift: true in its hyperparams.yaml).
PUBLISHED_PARAMS = 25_734_966
LEADERBOARD_MODEL = "SevenNet-MF-ompa"

_MODAL_MAP = {"mpa": 0, "omat24": 1}  # the two fidelities of SevenNet-MF-ompa


def build(dtype: str = "float32", device: str = "cpu", modal: str = "mpa", seed: int = 0):
    """-> (SevenNetCalculator, info). The tensor-product accelerators are GPU-only optional packages
    (cuEquivariance, FlashTP, OpenEquivariance), none installed here; the package's own switches
    SEVENNET_ENABLE_CUEQ / _FLASH / _OEQ = 1 are honoured (the package falls back to e3nn, with a
    warning, when one is unavailable)."""
    import sevenn
    import sevenn._keys as KEY
    import yaml
    from sevenn.calculator import SevenNetCalculator
    from sevenn.model_build import build_E3_equivariant_model
    from sevenn.parse_input import init_model_config

    if dtype != "float32":
        raise ValueError(
            f"dtype {dtype!r}: SevenNet is float32 only. Its ASE calculator casts every input to float32 "
            "(AtomGraphData.from_numpy_dict -> sevenn.util.dtype_correct), and its trainer raises "
            "'double precision is not implemented yet' for dtype: double (sevenn/main/sevenn.py)."
        )

    preset = os.path.join(os.path.dirname(sevenn.__file__), "presets", "mf_ompa_fine_tune.yaml")
    with open(preset) as f:
        cfg = init_model_config(yaml.safe_load(f)["model"])
    cfg.update({
        KEY.CONV_DENOMINATOR: 40.0,
        KEY.SHIFT: -5.0,
        KEY.SCALE: 1.5,
        KEY.USE_MODALITY: True,
        KEY.NUM_MODALITIES: len(_MODAL_MAP),
        KEY.MODAL_MAP: dict(_MODAL_MAP),
        KEY.USE_MODAL_WISE_SHIFT: True,
        KEY.USE_MODAL_WISE_SCALE: False,
    })
    accel = [name for name, env in (("cueq", "SEVENNET_ENABLE_CUEQ"), ("flash", "SEVENNET_ENABLE_FLASH"),
                                    ("oeq", "SEVENNET_ENABLE_OEQ")) if os.getenv(env) == "1"]
    if "cueq" in accel:
        cfg[KEY.CUEQUIVARIANCE_CONFIG] = {"use": True}
    cfg[KEY.USE_FLASH_TP] = "flash" in accel
    cfg[KEY.USE_OEQ] = "oeq" in accel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_E3_equivariant_model(cfg)

    calc = SevenNetCalculator(model, file_type="model_instance", device=device, modal=modal)
    info = {
        "params": sum(p.numel() for p in model.parameters()),
        "weights": "random",
        "note": (
            "sevenn presets/mf_ompa_fine_tune.yaml architecture, random init (checkpoint is a GitHub "
            f"download); modal={modal!r}, cutoff 6.0 A, float32, tensor-product accelerators: "
            f"{', '.join(accel) if accel else 'none (e3nn)'}"
        ),
    }
    return calc, info
