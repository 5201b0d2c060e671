"""Readout (spec §6): atomic energies, magnetic moments and fixed per-element reference energies."""

from __future__ import annotations

import torch
from torch import nn

from .layers import activation

NUM_ELEMENTS = 94


class EnergyHead(nn.Module):
    """``ε_i = MLP_E(h̃_i)``: ``Lin act [Dropout Lin act]… Dropout Lin(→1)``; keys ``energy_head.layers.*``."""

    def __init__(self, d_in: int, hidden: tuple[int, ...], act: str, dropout: float):
        super().__init__()
        layers: list[nn.Module] = []
        widths = (d_in,) + tuple(hidden)
        for k in range(len(hidden)):
            if k > 0:
                layers.append(nn.Dropout(dropout))
            layers += [nn.Linear(widths[k], widths[k + 1]), activation(act)]
        layers += [nn.Dropout(dropout), nn.Linear(widths[-1], 1)]
        self.energy_head = nn.Module()
        self.energy_head.layers = nn.Sequential(*layers)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``[N, d_n]`` → ``[N]`` atomic energies, eV."""
        return self.energy_head.layers(h).squeeze(-1)


class MagmomHead(nn.Module):
    """``m_i = |Lin(d_n→2d_n) → act → Dropout → Lin(→1)|``; keys ``magmom_head.layers.*``."""

    def __init__(self, d_in: int, act: str, dropout: float):
        super().__init__()
        self.magmom_head = nn.Module()
        self.magmom_head.layers = nn.Sequential(nn.Linear(d_in, 2 * d_in), activation(act), nn.Dropout(dropout),
                                                nn.Linear(2 * d_in, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``[N, d_n]`` → ``[N]`` magnetic moments, μB."""
        return torch.abs(self.magmom_head.layers(h).squeeze(-1))


class ReferenceEnergy(nn.Module):
    """Fixed per-element reference ``w · (element counts / N)``, eV/atom, Z = 1..``num_elements``; key ``fc.weight``."""

    def __init__(self, num_elements: int = NUM_ELEMENTS):
        super().__init__()
        self.num_elements = int(num_elements)
        self.fc = nn.Linear(self.num_elements, 1, bias=False)
        self.fc.weight.requires_grad_(False)
        nn.init.zeros_(self.fc.weight)

    def forward(self, atomic_numbers: torch.Tensor, atom_batch: torch.Tensor, n_atoms: torch.Tensor) -> torch.Tensor:
        """Per-structure mean reference energy ``[S]``, eV/atom."""
        counts = torch.zeros(n_atoms.shape[0], self.num_elements, dtype=self.fc.weight.dtype,
                             device=atomic_numbers.device)
        counts.index_put_((atom_batch, atomic_numbers - 1), torch.ones_like(atom_batch, dtype=counts.dtype),
                          accumulate=True)
        return self.fc(counts / n_atoms.unsqueeze(1).to(counts.dtype)).squeeze(-1)
