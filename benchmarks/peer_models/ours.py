"""MatRIS-10M, this package: the published 10M architecture (``MatRISConfig.published_10m()``: 10
blocks of width 128, Fourier three-body basis, LayerNorm, energy head 256-128-128, r_c 6 Å, r_3 4.5 Å)
with random weights (the published MatRIS-10M-OAM weights download at run time; speed and memory do
not depend on the values), through :class:`matris.MatRISCalculator` with its default kernels (the C++
operators on a CPU, Triton on CUDA) and the automatic memory level. ``compile=True``: the
calculator's ``compile=True`` (Inductor; its compile time is spent in the untimed first calls).
Run from the built wheel installed in its own environment (``python -m benchmarks.peers --setup ours``)."""

NAME = "MatRIS-10M (ours)"
PACKAGE = "matris (this repository's wheel)"
PYTHON = "3.11"
REQUIREMENTS = ["torch==2.13.0", "{wheel}"]  # {wheel}: the wheel python -m benchmarks.peers --setup builds
PUBLISHED_PARAMS = 10_443_505  # MatRIS-10M-OAM, models/matris/matris-10m-oam.yml (model_params)
LEADERBOARD_MODEL = "MatRIS-10M-OAM"


def build(dtype: str = "float32", device: str = "cpu", compile: bool = False):
    from matris import MatRIS, MatRISCalculator, MatRISConfig

    model = MatRIS(MatRISConfig.published_10m())
    calc = MatRISCalculator(model, device=device, dtype=dtype, compile=compile)
    info = {"params": sum(p.numel() for p in calc.model.parameters()), "weights": "random",
            "note": "default kernels" + (", compile=True" if compile else "")}
    return calc, info
