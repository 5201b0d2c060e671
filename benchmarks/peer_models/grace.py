"""GRACE-2L-OAM: the two-layer, semi-local Graph Atomic Cluster Expansion foundation model of ICAMS
(pre-fitted on OMat24, fine-tuned on sAlex+MPtrj; 89 elements, fixed 6 Å cutoff; 12,597,516 parameters),
run in TensorFlow through the package's ASE calculator ``tensorpotential.calculator.TPCalculator``.

Weights: random, at the published hyperparameters. ``grace_fm("GRACE-2L-OAM")`` downloads the SavedModel
from Hugging Face at run time, which cannot work here, so build() makes the same architecture from the
package's preset, exports it as a SavedModel into a temporary folder (``TPModel.save_model``, XLA
``jit_compile=True``, as gracemaker exports the foundation models) and loads that folder with TPCalculator
with grace_fm's calculator settings (pad_neighbors_fraction=0.05, pad_atoms_number=10,
max_number_reduction_recompilation=2, default mode "diverse" = segment_sum aggregation).

Hyperparameters: preset ``GRACE_2LAYER_v1_24`` of tensorpotential/potentials/presets.py (identical, apart
from the dense-aggregation switch, to the preset ``GRACE_2LAYER`` of tensorpotential 0.4.5, the version the
model was released with: matbench-discovery models/grace/grace-2l-oam.yml requirements) with rcut=6
(gracemaker docs, foundation.md: "fixed 6 Å cutoff"), lmax=[4, 4], n_rad_max=[32, 32], n_mlp_dens=12,
max_order=4, norm_out="layer" and the preset's defaults (embedding_size=128, n_rad_base=8 Chebyshev
functions, cutoff_function_order=5, indicator_lmax=1, MLP radial functions [64, 64]), over the 89 elements
of ``ALEXANDRIA_ELEMENTS`` (tensorpotential/scripts/grace_preprocess.py; the MPtrj/Alexandria set). These
values are not published as a config: they are the setting that gives exactly the published parameter count
12,597,516 (matbench-discovery grace-2l-oam.yml ``model_params``), found by counting the preset's trainable
variables over lmax in {3,4}^2, n_rad_max in {32,42}x{32,48,64}, n_mlp_dens in {10,12,16} (unique exact
match). The same procedure reproduces GRACE-1L-OAM exactly (preset GRACE_1LAYER_v1_24 "medium" + norm_out
"layer" = 3,447,148 = its model_params), which supports the method. Not recoverable from the count and left
at the preset's defaults: avg_n_neigh (a normalising constant, set to 40 here so random-weight outputs stay
O(1); it costs nothing) and the output scale/shift (constants); no ZBL term (the docs name none).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

NAME = "GRACE-2L-OAM"
PACKAGE = "tensorpotential==0.6.2.1"
PYTHON = "3.11"
REQUIREMENTS = [
    # tensorpotential requires tensorflow[and-cuda]<=2.20 on Linux (GBs of NVIDIA wheels): install the CPU
    # TensorFlow first, then the package without its dependencies, then the rest of its dependencies
    # (versions as installed on 2026-12-06; no torch in this venv).
    "tensorflow==2.20.0 tf_keras==2.20.1",
    "--no-deps tensorpotential==0.6.2.1",
    "scipy==1.17.1 matscipy==1.3.1 numpy==2.4.6 sympy==1.14.0 pandas==2.3.3 ase==3.29.0 PyYAML==6.0.4 "
    "tqdm==4.70.1 requests==2.34.2 questionary==2.1.1 rich==15.0.0 scikit-learn==1.9.1",
]
# matbench-discovery models/grace/grace-2l-oam.yml, model_params: 12_597_516
PUBLISHED_PARAMS = 12_597_516
LEADERBOARD_MODEL = "GRACE-2L-OAM"

PRESET = "GRACE_2LAYER_v1_24"
HYPERPARAMS = dict(rcut=6.0, lmax=[4, 4], n_rad_max=[32, 32], n_mlp_dens=12, max_order=4, norm_out="layer",
                   avg_n_neigh=40.0)

_THREADS_SET: tuple[int, int] | None = None


def _set_threads(threads: int | None, interop: int | None) -> tuple[int, int]:
    """TensorFlow's counterpart of torch.set_num_threads: intra-op threads = ``threads`` (else
    TF_NUM_INTRAOP_THREADS, OMP_NUM_THREADS, os.cpu_count()), inter-op threads = ``interop`` (else
    TF_NUM_INTEROP_THREADS, else 1: one calculator call is one graph, as torch runs its ops in sequence).
    TensorFlow takes them only before its runtime starts, so once per process."""
    global _THREADS_SET
    import tensorflow as tf

    intra = threads or int(os.environ.get("TF_NUM_INTRAOP_THREADS") or os.environ.get("OMP_NUM_THREADS")
                           or os.cpu_count() or 1)
    inter = interop or int(os.environ.get("TF_NUM_INTEROP_THREADS") or 1)
    if _THREADS_SET is None:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
        _THREADS_SET = (intra, inter)
    elif _THREADS_SET != (intra, inter):
        raise RuntimeError(f"TensorFlow's threads are already {_THREADS_SET}; a process takes one setting")
    return _THREADS_SET


def build(dtype: str = "float32", device: str = "cpu", threads: int | None = None, interop: int | None = None,
          seed: int = 0):
    """-> (TPCalculator, info). dtype is the weights' precision: "float64" is the published model's (all
    GRACE OAM models ship fp64); "float32" keeps GRACE's mixed mode (gracemaker ``param_dtype: float32``:
    weights and feature arithmetic in float32, geometry inputs -- positions, bond vectors, cell -- in float64;
    the precision of tensorpotential's newer fp32 releases of other GRACE models)."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, not {dtype!r}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # tensorpotential first: it switches on TF's numpy type promotion, which must precede any TF call
    import tensorpotential  # noqa: F401, I001
    import numpy as np
    import tensorflow as tf
    from tensorpotential.calculator import TPCalculator
    from tensorpotential.potentials import get_preset
    from tensorpotential.scripts.grace_preprocess import ALEXANDRIA_ELEMENTS
    from tensorpotential.tpmodel import TPModel

    intra, inter = _set_threads(threads, interop)
    if device == "cpu" and tf.config.list_physical_devices("GPU"):
        tf.config.set_visible_devices([], "GPU")
    tf.random.set_seed(seed)
    elements = sorted(ALEXANDRIA_ELEMENTS)
    instructions = get_preset(PRESET)(element_map={e: i for i, e in enumerate(elements)}, **HYPERPARAMS)
    model = TPModel(instructions.get_instructions())
    model.build(param_dtype=getattr(tf, dtype), input_signature_float_dtype=tf.float64, jit_compile=True)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)

    path = tempfile.mkdtemp(prefix="grace_2l_oam_")
    atexit.register(shutil.rmtree, path, True)
    model.save_model(path, jit_compile=True, input_signature_float_dtype=tf.float64)
    calc = TPCalculator(model=path, pad_neighbors_fraction=0.05, pad_atoms_number=10,
                        max_number_reduction_recompilation=2)
    note = (f"random weights, preset {PRESET} {HYPERPARAMS}, 89 elements; SavedModel (XLA jit) in a temp dir "
            f"loaded by TPCalculator with grace_fm's settings; TF threads intra={intra} inter={inter}; "
            f"{'fp64 as published' if dtype == 'float64' else 'mixed: fp32 weights, fp64 geometry'}; "
            "XLA compiles anew for each padded size (first call per size is slow)")
    return calc, {"params": params, "weights": "random", "note": note}
