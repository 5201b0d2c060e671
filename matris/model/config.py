"""The constructor configuration of a MatRIS model (spec §1)."""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

ACTIVATIONS = ("relu", "silu", "gelu", "softplus", "sigmoid", "tanh")
NORMS = ("rms", "layer")


@dataclass
class MatRISConfig:
    """Hyper-parameters of MatRIS, with the names and defaults of published checkpoints (lengths in Å).

    ``to_dict()`` gives a checkpoint's ``config`` entry. It also reads as the official ``model.config`` dict does
    (``config["pairwise_cutoff"]``, ``config.get(...)``, ``dict(config)``, ``MatRIS(**config)``) and pickles as a plain
    mapping of its fields, so the official ``torch.save({"config": model.config, "state_dict": ...}, path)`` writes a
    checkpoint that ``torch.load(weights_only=True)`` reads in either package (official loader, :meth:`MatRIS.load`)."""

    num_layers: int = 6
    node_feat_dim: int = 128
    edge_feat_dim: int = 128
    three_body_feat_dim: int = 128
    mlp_hidden_dims: tuple[int, ...] = (128, 128)
    dropout: float = 0.0
    use_bias: bool = False
    distance_expansion: str = "Bessel"
    three_body_expansion: str = "SH"
    num_radial: int = 7
    num_angular: int = 7
    max_l: int = 4
    max_n: int = 4
    envelope_exponent: int = 8
    graph_conv_mlp: str = "GateMLP"
    activation_type: str = "silu"
    norm_type: str = "rms"
    pairwise_cutoff: float = 6.0
    three_body_cutoff: float = 4.0
    use_smoothed_for_delta_edge: bool = False
    learnable_basis: bool = True
    is_intensive: bool = True
    is_conservation: bool = True
    reference_energy: str | None = None

    def __post_init__(self) -> None:
        self.mlp_hidden_dims = tuple(int(h) for h in self.mlp_hidden_dims)
        problems = []
        if self.num_layers < 1:
            problems.append(f"num_layers must be >= 1, got {self.num_layers}")
        if self.distance_expansion not in ("Bessel", "Gaussian"):
            problems.append(f"distance_expansion must be 'Bessel' or 'Gaussian', got {self.distance_expansion!r}")
        if self.three_body_expansion.lower() not in ("sh", "fourier"):
            problems.append(f"three_body_expansion must be 'SH' or 'Fourier', got {self.three_body_expansion!r}")
        if self.three_body_expansion.lower() == "fourier" and self.num_angular % 2 != 1:
            problems.append(f"the Fourier basis needs an odd num_angular, got {self.num_angular}")
        if self.three_body_expansion.lower() == "sh" and not (1 <= self.max_l <= 4 and 1 <= self.max_n <= 4):
            problems.append(f"the SH basis needs 1 <= max_l, max_n <= 4, got max_l={self.max_l}, max_n={self.max_n}")
        if self.num_angular != self.num_radial:
            problems.append(
                f"the line-graph envelope needs num_angular == num_radial, got {self.num_angular} and {self.num_radial}"
            )
        if self.graph_conv_mlp not in ("GateMLP", "MLP"):
            problems.append(f"graph_conv_mlp must be 'GateMLP' or 'MLP', got {self.graph_conv_mlp!r}")
        if self.activation_type not in ACTIVATIONS:
            problems.append(f"activation_type must be one of {ACTIVATIONS}, got {self.activation_type!r}")
        if self.norm_type not in NORMS:
            problems.append(f"norm_type must be one of {NORMS} ('batch' is not supported), got {self.norm_type!r}")
        if not 0 < self.three_body_cutoff <= self.pairwise_cutoff:
            problems.append("need 0 < three_body_cutoff <= pairwise_cutoff, "
                            f"got {self.three_body_cutoff} and {self.pairwise_cutoff}")
        if not self.is_conservation:
            problems.append("is_conservation=False (direct force/stress heads) is not supported; "
                            "no published model uses it")
        if problems:
            raise ValueError("invalid MatRIS config: " + "; ".join(problems))

    @classmethod
    def published_10m(cls, **overrides: Any) -> "MatRISConfig":
        """The architecture of the published MatRIS-10M models (-OAM, -MP, -OMAT); a checkpoint's own config wins.

        10 blocks of width 128, Bessel radial basis (7, envelope 8), Fourier three-body basis (7 terms, learnable
        frequencies), GateMLP with SiLU and LayerNorm, bias-free Linears, energy head (256, 128, 128), r_c = 6 Å,
        r_3 = 4.5 Å, reference energies of 94 elements: 10,443,411 parameters without the reference energies (official
        1.0 loader), 10,443,505 with them (v0.9 loader, Matbench Discovery). Heads (256, 192) and (128, 256, 128) give
        the same count; the official 1.0 code (PyPI wheel) builds the published checkpoints with this one."""
        values = dict(num_layers=10, node_feat_dim=128, edge_feat_dim=128, three_body_feat_dim=128,
                      mlp_hidden_dims=(256, 128, 128), use_bias=False, distance_expansion="Bessel",
                      three_body_expansion="Fourier", num_radial=7, num_angular=7, envelope_exponent=8,
                      graph_conv_mlp="GateMLP", activation_type="silu", norm_type="layer", pairwise_cutoff=6.0,
                      three_body_cutoff=4.5, reference_energy="published")
        return cls(**{**values, **overrides})

    # ------------------------------------------------------------ the official dict's reading
    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._names():
            raise KeyError(f"{key!r} is not a MatRIS config key; the keys are {sorted(self._names())}")
        setattr(self, key, value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def keys(self):
        return self.to_dict().keys()

    def items(self):
        return self.to_dict().items()

    def values(self):
        return self.to_dict().values()

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self._names() else default

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def __reduce_ex__(self, protocol):
        # pickled as an OrderedDict of the fields (a type torch.load(weights_only=True) allows), so checkpoints that
        # hold a config load anywhere; MatRIS.__setstate__ and from_dict turn the mapping back into a config
        return (collections.OrderedDict, (), None, None, iter(self.to_dict().items()))

    def __copy__(self) -> "MatRISConfig":
        return dataclasses.replace(self)

    def __deepcopy__(self, memo) -> "MatRISConfig":
        return dataclasses.replace(self)

    @property
    def three_body_basis_size(self) -> int:
        """Width of the angle basis: max_l·max_n for SH, num_angular for Fourier."""
        if self.three_body_expansion.lower() == "sh":
            return self.max_l * self.max_n
        return self.num_angular

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's ``config`` entry (plain Python types only)."""
        out = dataclasses.asdict(self)
        out["mlp_hidden_dims"] = list(self.mlp_hidden_dims)
        return out

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "MatRISConfig":
        """Build from a checkpoint's ``config``; unknown keys are ignored with a warning."""
        if isinstance(config, MatRISConfig):
            return dataclasses.replace(config)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            warnings.warn(f"ignoring unknown MatRIS config keys {unknown}", stacklevel=2)
        return cls(**{k: v for k, v in config.items() if k in known})


Mapping.register(MatRISConfig)  # isinstance(config, Mapping), as the official dict is

__all__ = ["MatRISConfig", "ACTIVATIONS", "NORMS"]

