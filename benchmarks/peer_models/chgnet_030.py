"""CHGNet 0.3.0: Crystal Hamiltonian Graph Network (Deng et al., Nat. Mach. Intell. 5, 1031 (2023)),
a charge-informed graph network with atom, bond (6 Å atom-graph cutoff) and angle (3 Å bond-graph cutoff)
message passing, trained on MPtrj; published size 412,525 parameters.

Weights: the published 0.3.0 checkpoint shipped inside the pip package
(chgnet/pretrained/0.3.0/chgnet_0.3.0_e29f68s314m37.pth.tar), loaded with CHGNet.load(model_name="0.3.0");
every hyperparameter comes from that checkpoint's stored config (nothing is set here).
Calculator: chgnet.model.dynamics.CHGNetCalculator with its default stress_weight = ase.units.GPa
(= 1/160.2177): the model predicts stress in GPa, the factor converts it to eV/Å^3 with ASE's sign
convention (stress = (1/V) dE/dstrain, positive = tensile); checked against a finite difference of the
energy under strain. The calculator returns a 3x3 stress; ase.Atoms.get_stress() gives Voigt-6.
"""
import contextlib
import sys

NAME = "CHGNet 0.3.0"
PACKAGE = "chgnet==0.4.2"
PYTHON = "3.11"
REQUIREMENTS = ["torch==2.13.0", "chgnet==0.4.2"]
# 412,525: CHGNet README / pretrained/0.3.0/README.md, and matbench-discovery models/chgnet/chgnet-0.3.0.yml
PUBLISHED_PARAMS = 412_525
LEADERBOARD_MODEL = "CHGNet"


def build(dtype: str = "float32", device: str = "cpu"):
    if dtype != "float32":
        raise ValueError(
            "CHGNet supports float32 only: chgnet hardcodes TORCH_DTYPE = torch.float32 in "
            "chgnet.graph.converter / chgnet.graph.crystalgraph (graph positions, lattice, volumes)"
        )
    from chgnet.model import CHGNet
    from chgnet.model.dynamics import CHGNetCalculator

    # CHGNet prints device/param lines on stdout; keep stdout clean for the worker.
    with contextlib.redirect_stdout(sys.stderr):
        # pass the device explicitly: with use_device=None chgnet picks CHGNET_DEVICE / mps / cuda itself
        model = CHGNet.load(model_name="0.3.0", use_device=device, verbose=False)
        calc = CHGNetCalculator(model=model, use_device=device)  # default stress_weight = ase.units.GPa
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    return calc, {
        "params": params,
        "weights": "published",
        "note": f"chgnet {model.version} checkpoint shipped in the package; graph converter "
        f"algorithm={model.graph_converter.algorithm!r}; stress GPa*ase.units.GPa -> eV/A^3; "
        "each call converts ASE Atoms -> pymatgen Structure and builds the graph on the CPU",
    }
