"""One adapter per potential: MatRIS (the reference of every ratio), CHGNet, SevenNet, MACE, MatterSim.

An adapter loads its model once and hands out ASE calculators: one for the energy + forces
+ stress calls and one for MD (the same one, except MatRIS, whose MD calculator skips the
stress as ``matris md`` does at fixed cell). Where the package exposes its graph
construction, the adapter also gives a function that builds the graph of a structure, so
its time can be shown apart.

The other potentials are optional. An adapter whose package is missing raises
:class:`NotAvailable` with the pip command; one whose weights cannot be loaded (they are
often downloaded on first use) raises it with the reason. A benchmark reports both as
skipped and goes on; it never crashes on them. Their own default pretrained weights are
used unless a variant is named (``--compare mace:small``).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from ..errors import MatRISInputError

NOT_INSTALLED = "not installed"
LOAD_FAILED = "failed to load"


class NotAvailable(Exception):
    """A comparison model that cannot run here. ``status`` is :data:`NOT_INSTALLED` or :data:`LOAD_FAILED`."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def import_optional(module: str, package: str, pip: str) -> Any:
    """Import ``module`` of the optional ``package``, or raise :class:`NotAvailable`.

    A missing package is :data:`NOT_INSTALLED` (with ``pip install PIP``); a package that is
    there but fails to import (a broken install, a missing dependency) is :data:`LOAD_FAILED`.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == package:
            raise NotAvailable(NOT_INSTALLED, f"{package} is not installed; pip install {pip}") from None
        raise NotAvailable(LOAD_FAILED, f"importing {module} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a third-party import can fail in any way
        raise NotAvailable(LOAD_FAILED, f"importing {module} failed: {type(exc).__name__}: {exc}") from None


class Runner:
    """An adapter. Subclasses set ``key``, ``name``, ``package``, ``pip`` and ``default_variant``.

    ``variant`` selects the weights (a model name or a file, as the package understands it).
    After :meth:`load`, ``device``, ``dtype`` (the precision actually used, a string) and
    ``parameters`` are known.
    """

    key = ""
    name = ""
    package = ""
    pip = ""
    default_variant: str | None = None

    def __init__(self, variant: str | None = None):
        self.variant = variant or self.default_variant
        self.device: torch.device | None = None
        self.dtype: str | None = None
        self.parameters: int | None = None
        self._calc: Any = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.variant})" if self.variant else self.name

    def load(self, device: torch.device, dtype: str) -> None:
        """Load the model on ``device``; ``dtype`` ("float32"/"float64") is a request that
        adapters whose models have a fixed precision ignore (see ``self.dtype``)."""
        raise NotImplementedError

    def calculator(self) -> Any:
        """The ASE calculator for energy + forces + stress calls."""
        return self._calc

    def md_calculator(self) -> Any:
        """The ASE calculator for MD."""
        return self.calculator()

    def graph_builder(self) -> Callable[[Any], Any] | None:
        """Structure (ASE Atoms) → the model's input graph, or None where that is not exposed."""
        return None

    def info(self) -> dict:
        return {"key": self.key, "label": self.label, "variant": self.variant, "package": self.package,
                "device": None if self.device is None else str(self.device), "dtype": self.dtype,
                "parameters": self.parameters}

    def _loaded(self, what: Callable[[], Any]) -> Any:
        """Run a third-party loading step; any failure becomes :class:`NotAvailable`."""
        try:
            return what()
        except NotAvailable:
            raise
        except Exception as exc:  # noqa: BLE001 - downloads, missing weights, version clashes...
            raise NotAvailable(LOAD_FAILED, f"{self.label} could not be loaded ({type(exc).__name__}: {exc}); its "
                               "weights may need a download (is there network access?) or another version "
                               f"({self.pip})") from None


def _count(module: Any) -> int | None:
    try:
        return int(sum(p.numel() for p in module.parameters()))
    except Exception:  # noqa: BLE001 - not a torch module
        return None


class MatRISRunner(Runner):
    """This package's model: ``variant`` is a checkpoint path, a model name ``MatRIS.load``
    knows, None for the bundled demo model, or a :class:`MatRIS` object (kept as it is)."""

    key = "matris"
    name = "MatRIS"
    package = "matris"
    pip = "matris"

    def __init__(self, model: Any = None):
        from ..model import MatRIS

        self.model_obj = model if isinstance(model, MatRIS) else None
        variant = None if self.model_obj is not None else (str(model) if model is not None else "matris-demo")
        super().__init__(variant)
        self.model: Any = None

    @property
    def label(self) -> str:
        if self.variant is None:
            return "MatRIS"
        from pathlib import Path

        return f"MatRIS ({Path(self.variant).name})"

    def load(self, device: torch.device, dtype: str) -> None:
        from ..calculator import MatRISCalculator, resolve_dtype
        from ..model import MatRIS

        if self.model_obj is not None:
            self.model = self.model_obj
            device, torch_dtype = self.model.device, self.model.dtype
        else:  # a bad --model is the user's error, not a skipped comparison: let it raise
            torch_dtype = resolve_dtype(dtype)
            self.model = MatRIS.load(self.variant, device=device, dtype=torch_dtype)
        self.device, self.dtype = torch.device(device), str(torch_dtype).replace("torch.", "")
        self.parameters = self.model.num_parameters()
        self._calc = MatRISCalculator(self.model, device=self.device, dtype=torch_dtype)
        self._md_calc = MatRISCalculator(self.model, device=self.device, dtype=torch_dtype, compute_stress=False)

    def md_calculator(self) -> Any:
        return self._md_calc

    def graph_builder(self) -> Callable[[Any], Any]:
        from ..graph import GraphBatch
        from ..structures import to_system

        model, device = self.model, self.device

        def build(atoms: Any) -> Any:
            return GraphBatch.from_systems([to_system(atoms)], model.cutoff, model.three_body_cutoff,
                                           dtype=model.dtype, device=device)

        return build


def _patch_ase_for_chgnet() -> None:
    """chgnet ≤ 0.4 imports ``ExpCellFilter`` from ``ase.constraints``; ASE ≥ 3.23 moved it to
    ``ase.filters``. Put the name back where chgnet looks (nothing else changes)."""
    try:
        import ase.constraints
        import ase.filters
    except ImportError:
        return
    if not hasattr(ase.constraints, "ExpCellFilter") and hasattr(ase.filters, "ExpCellFilter"):
        ase.constraints.ExpCellFilter = ase.filters.ExpCellFilter


class CHGNetRunner(Runner):
    key = "chgnet"
    name = "CHGNet"
    package = "chgnet"
    pip = "chgnet"
    default_variant = "0.3.0"

    def load(self, device: torch.device, dtype: str) -> None:
        _patch_ase_for_chgnet()
        model_mod = import_optional("chgnet.model", self.package, self.pip)
        dyn_mod = import_optional("chgnet.model.dynamics", self.package, self.pip)
        self.model = self._loaded(lambda: model_mod.CHGNet.load(model_name=self.variant, use_device=str(device),
                                                                 verbose=False))
        self._calc = self._loaded(lambda: dyn_mod.CHGNetCalculator(model=self.model, use_device=str(device)))
        self.device, self.dtype, self.parameters = torch.device(device), "float32", _count(self.model)

    def graph_builder(self) -> Callable[[Any], Any]:
        from pymatgen.io.ase import AseAtomsAdaptor

        converter = self.model.graph_converter

        def build(atoms: Any) -> Any:
            return converter(AseAtomsAdaptor.get_structure(atoms))

        return build


class SevenNetRunner(Runner):
    key = "sevennet"
    name = "SevenNet"
    package = "sevenn"
    pip = "sevenn"
    default_variant = "7net-0"

    def load(self, device: torch.device, dtype: str) -> None:
        try:
            mod = import_optional("sevenn.calculator", self.package, self.pip)
        except NotAvailable as exc:
            if exc.status == NOT_INSTALLED:
                raise
            mod = import_optional("sevenn.sevennet_calculator", self.package, self.pip)  # sevenn < 0.10
        self._calc = self._loaded(lambda: mod.SevenNetCalculator(model=self.variant, device=str(device)))
        self.device, self.dtype = torch.device(device), "float32"
        self.parameters = _count(getattr(self._calc, "model", None))


class MACERunner(Runner):
    key = "mace"
    name = "MACE"
    package = "mace"
    pip = "mace-torch"
    default_variant = "medium"

    def load(self, device: torch.device, dtype: str) -> None:
        mod = import_optional("mace.calculators", self.package, self.pip)
        self._calc = self._loaded(lambda: mod.mace_mp(model=self.variant, device=str(device), default_dtype=dtype))
        self.device, self.dtype = torch.device(device), dtype
        models = getattr(self._calc, "models", None)
        self.parameters = _count(models[0]) if models else None


class MatterSimRunner(Runner):
    key = "mattersim"
    name = "MatterSim"
    package = "mattersim"
    pip = "mattersim"
    default_variant = "MatterSim-v1.0.0-1M.pth"

    def load(self, device: torch.device, dtype: str) -> None:
        mod = import_optional("mattersim.forcefield", self.package, self.pip)
        self._calc = self._loaded(lambda: mod.MatterSimCalculator(load_path=self.variant, device=str(device)))
        self.device, self.dtype = torch.device(device), "float32"
        potential = getattr(self._calc, "potential", None)
        self.parameters = _count(getattr(potential, "model", potential))


COMPARISONS: dict[str, type[Runner]] = {
    "chgnet": CHGNetRunner,
    "sevennet": SevenNetRunner,
    "mace": MACERunner,
    "mattersim": MatterSimRunner,
}
ALIASES = {"7net": "sevennet", "sevenn": "sevennet", "mace-mp": "mace"}


def comparison(spec: str) -> Runner:
    """The adapter named by ``spec``: ``NAME`` or ``NAME:VARIANT`` (e.g. ``mace:small``,
    ``chgnet:0.2.0``, ``mattersim:MatterSim-v1.0.0-5M.pth``)."""
    name, _, variant = str(spec).partition(":")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in COMPARISONS:
        raise MatRISInputError(f"unknown comparison model {spec!r}; use one of {sorted(COMPARISONS)} "
                               "(optionally NAME:VARIANT, e.g. mace:small)")
    return COMPARISONS[key](variant.strip() or None)


__all__ = ["ALIASES", "COMPARISONS", "CHGNetRunner", "LOAD_FAILED", "MACERunner", "MatRISRunner",
           "MatterSimRunner", "NOT_INSTALLED", "NotAvailable", "Runner", "SevenNetRunner", "comparison",
           "import_optional"]
