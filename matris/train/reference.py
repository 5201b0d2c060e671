"""Per-element reference energies: a least-squares fit on composition, or fixed values from a file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import MatRISInputError
from ..graph.system import element_symbol
from ..model import MatRIS
from ..model.readout import NUM_ELEMENTS, ReferenceEnergy


def _per_atom_rows(composition: np.ndarray, energy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the per-atom fit: ``x = c_s / N_s`` ``[s, 94]`` and ``y = E_s / N_s`` of labelled structures."""
    composition = np.asarray(composition, dtype=np.float64)
    energy = np.asarray(energy, dtype=np.float64)
    ok = np.isfinite(energy) & (composition.sum(1) > 0)
    n = composition[ok].sum(1, keepdims=True)
    return composition[ok] / n, energy[ok] / n[:, 0]


def _no_energy() -> MatRISInputError:
    return MatRISInputError("cannot fit reference energies: no training structure has an energy label; "
                            "set reference_energy.mode to 'none' or to a file of fixed values")


def fit_reference_energies(composition: np.ndarray, energy: np.ndarray) -> np.ndarray:
    """Per-element energies ``w`` (eV/atom) minimising Σ_s (E_s/N_s − w·c_s/N_s)².

    composition: ``[S, 94]`` atom counts of Z = 1..94; energy: ``[S]`` total energies, eV
    (NaN = unlabelled, skipped). This matches the model's reference term, the per-atom
    average ``w · counts / N``. Elements absent from the data get 0; when compositions do
    not determine ``w`` uniquely (e.g. a single composition) the minimum-norm solution is
    taken, which still reproduces the mean energy of every composition seen.
    """
    x, y = _per_atom_rows(composition, energy)
    if not len(y):
        raise _no_energy()
    present = np.flatnonzero(x.any(0))
    w = np.zeros(NUM_ELEMENTS)
    w[present] = np.linalg.lstsq(x[:, present], y, rcond=None)[0]
    return w


def fit_reference_energies_chunked(chunks) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit_reference_energies` over ``(composition [s, 94], energy [s])`` chunks, in constant memory.

    Accumulates the normal equations of the per-atom fit chunk by chunk (a 94×94 matrix),
    then takes their minimum-norm solution on the elements present, which is the same
    solution as the direct fit. Returns ``(w [94] eV/atom, present [94] bool)``.
    """
    a = np.zeros((NUM_ELEMENTS, NUM_ELEMENTS))
    b = np.zeros(NUM_ELEMENTS)
    present = np.zeros(NUM_ELEMENTS, dtype=bool)
    n_ok = 0
    for composition, energy in chunks:
        x, y = _per_atom_rows(composition, energy)
        a += x.T @ x
        b += x.T @ y
        present |= x.any(0)
        n_ok += len(y)
    if n_ok == 0:
        raise _no_energy()
    idx = np.flatnonzero(present)
    w = np.zeros(NUM_ELEMENTS)
    w[idx] = np.linalg.lstsq(a[np.ix_(idx, idx)], b[idx], rcond=None)[0]
    return w, present


@dataclass
class Refit:
    """What :func:`refit_reference_energies` found: the new values ``[94]`` eV/atom, the elements it
    fitted (those of the training data), their shifts from the model's own values (eV/atom), the
    energy MAE per atom on the training structures before and after (eV/atom), and their number."""

    values: np.ndarray
    elements: list[str]
    shifts: list[float]
    mae_before: float
    mae_after: float
    n_structures: int

    def summary(self) -> str:
        shifts = ", ".join(f"{e} {s:+.4f}" for e, s in zip(self.elements, self.shifts))
        return (f"refitted the reference energies of {len(self.elements)} element"
                f"{'' if len(self.elements) == 1 else 's'} on {self.n_structures} training structure"
                f"{'' if self.n_structures == 1 else 's'} to the model's residual (shifts, eV/atom: {shifts}); "
                f"energy MAE on them {1000 * self.mae_before:.1f} -> {1000 * self.mae_after:.1f} meV/atom")


def refit_reference_energies(batches, current: np.ndarray | None) -> Refit:
    """Per-element reference energies fitted to what the network does not already predict.

    ``batches``: ``(composition [s, 94], label E [s], model E without its reference term [s],
    model E [s])`` in eV (:meth:`matris.train.MatRISDataModule.model_energies`; NaN labels are
    skipped); ``current``: the model's reference energies ``[94]`` (None: zeros). Minimises
    Σ_s ((E_s − E_model,s)/N_s − w·c_s/N_s)² over the elements present in the data; the others keep
    their ``current`` values. This absorbs the constant offset between the pretrained model and the
    user's DFT settings (code, pseudopotentials, functional) before the first step.
    """
    current = np.zeros(NUM_ELEMENTS) if current is None else np.asarray(current, dtype=np.float64).reshape(-1)
    xs, ys, before = [], [], []
    a = np.zeros((NUM_ELEMENTS, NUM_ELEMENTS))
    b = np.zeros(NUM_ELEMENTS)
    for composition, label, bare, full in batches:
        ok = np.isfinite(label) & (composition.sum(1) > 0)
        n = composition[ok].sum(1)
        x = composition[ok] / n[:, None]
        y = (label[ok] - bare[ok]) / n
        a += x.T @ x
        b += x.T @ y
        xs.append(x.astype(np.float32))
        ys.append(y)
        before.append(np.abs(label[ok] - full[ok]) / n)
    if not ys or not sum(len(y) for y in ys):
        raise _no_energy()
    present = np.flatnonzero(a.diagonal() > 0)
    values = current.copy()
    if len(values) < NUM_ELEMENTS:
        values = np.concatenate([values, np.zeros(NUM_ELEMENTS - len(values))])
    values[present] = np.linalg.lstsq(a[np.ix_(present, present)], b[present], rcond=None)[0]
    x, y = np.concatenate(xs), np.concatenate(ys)
    after = np.abs(y - x.astype(np.float64) @ values)
    old = np.zeros(NUM_ELEMENTS)
    old[: min(len(current), NUM_ELEMENTS)] = current[:NUM_ELEMENTS]
    return Refit(values, [element_symbol(int(z) + 1) for z in present], [float(values[z] - old[z]) for z in present],
                 float(np.concatenate(before).mean()), float(after.mean()), len(y))


def read_reference_energies(path: str | Path) -> np.ndarray:
    """Fixed values from a JSON file ``{symbol or Z: eV/atom}`` or from a checkpoint's ``reference_energy``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reference_energy.mode: no file {path} (give 'fit', 'keep', 'none', a JSON file "
                                "{symbol: eV/atom} or a checkpoint)")
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        symbols = {element_symbol(z): z for z in range(1, NUM_ELEMENTS + 1)}
        w = np.zeros(NUM_ELEMENTS)
        for key, value in data.items():
            z = int(key) if str(key).isdigit() else symbols.get(str(key))
            if z is None or not 1 <= z <= NUM_ELEMENTS:
                raise MatRISInputError(f"{path}: '{key}' is not an element symbol or atomic number 1-{NUM_ELEMENTS}")
            w[z - 1] = float(value)
        return w
    model = MatRIS.from_checkpoint(path)
    if model.reference_energy is None:
        raise MatRISInputError(f"{path} has no reference energies (its config has reference_energy: null)")
    return model.reference_energy.fc.weight.detach().double().numpy()[0]


def set_reference_energies(model: MatRIS, values: np.ndarray | None, name: str = "fitted") -> None:
    """Install (or remove, with ``None``) the fixed per-element reference term of ``model``."""
    if values is None:
        model.reference_energy = None
        model.config.reference_energy = None
        return
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if model.reference_energy is None or model.reference_energy.num_elements != len(values):
        # e.g. a checkpoint with 89 reference energies refitted over all 94 elements
        model.reference_energy = ReferenceEnergy(len(values)).to(device=model.device, dtype=model.dtype)
    with torch.no_grad():
        model.reference_energy.fc.weight.copy_(torch.as_tensor(values, dtype=model.dtype).reshape(1, -1))
    model.reference_energy.fc.weight.requires_grad_(False)
    model.config.reference_energy = name


__all__ = ["Refit", "refit_reference_energies", "fit_reference_energies", "fit_reference_energies_chunked",
           "read_reference_energies", "set_reference_energies"]
