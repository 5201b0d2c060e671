"""Which structures a shard relaxes: ``--shard I/N``, SLURM array defaults, and a deterministic,
balanced assignment of structures to shards.

Shards are numbered from 0: ``--shard 0/4`` … ``--shard 3/4``. Every shard computes the same
assignment from the same input (material ids and atom counts), so N independent processes,
GPUs or SLURM array tasks together relax every structure exactly once, with no coordination.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import MatRISInputError


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``."""

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not (isinstance(self.count, int) and self.count >= 1 and isinstance(self.index, int)
                and 0 <= self.index < self.count):
            raise MatRISInputError(
                f"invalid shard {self.index}/{self.count}: need 0 <= I < N (shards are numbered from 0, "
                f"e.g. --shard 0/{max(self.count, 1)} … --shard {max(self.count, 1) - 1}/{max(self.count, 1)})"
            )

    @property
    def name(self) -> str:
        """``shard-I-of-N``: the stem of this shard's result file."""
        return f"shard-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """``"I/N"`` → ``Shard(I, N)``."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not match:
            raise MatRISInputError(f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. --shard 0/4")
        return cls(int(match.group(1)), int(match.group(2)))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Shard | None":
        """The shard of a SLURM array task, or None outside one.

        ``SLURM_ARRAY_TASK_ID`` minus ``SLURM_ARRAY_TASK_MIN`` (0 when unset) of
        ``SLURM_ARRAY_TASK_COUNT``, so ``--array=0-9`` and ``--array=1-10`` both give 0/10 … 9/10.
        """
        env = os.environ if env is None else env
        task, count = env.get("SLURM_ARRAY_TASK_ID"), env.get("SLURM_ARRAY_TASK_COUNT")
        if not task or not count:
            return None
        try:
            index = int(task) - int(env.get("SLURM_ARRAY_TASK_MIN") or 0)
            return cls(index, int(count))
        except ValueError:
            raise MatRISInputError(
                f"SLURM_ARRAY_TASK_ID={task!r}, SLURM_ARRAY_TASK_MIN={env.get('SLURM_ARRAY_TASK_MIN')!r} and "
                f"SLURM_ARRAY_TASK_COUNT={count!r} do not give a shard (a contiguous --array such as 0-9 is needed); "
                "pass --shard I/N explicitly"
            ) from None


def resolve_shard(text: str | None = None, env: Mapping[str, str] | None = None) -> Shard:
    """``--shard`` if given, else the SLURM array task's shard, else ``0/1`` (everything)."""
    if text:
        return Shard.parse(text)
    return Shard.from_env(env) or Shard(0, 1)


def assign_shards(material_ids: Sequence[str], natoms: Sequence[int], count: int) -> list[int]:
    """The shard (0 … count-1) of every structure.

    Structures are sorted by atom count (largest first; ties by material id) and dealt out in a
    snake order (0, 1, …, N-1, N-1, …, 0, 0, 1, …): shard sizes differ by at most one structure
    and their total atom counts (a proxy for the relaxation cost) are close. The result depends
    only on the ids and atom counts, never on the process that computes it.
    """
    if len(material_ids) != len(natoms):
        raise ValueError("material_ids and natoms differ in length")
    Shard(0, count)  # validates count
    order = sorted(range(len(material_ids)), key=lambda k: (-int(natoms[k]), str(material_ids[k])))
    shards = [0] * len(order)
    for rank, k in enumerate(order):
        lap, pos = divmod(rank, count)
        shards[k] = pos if lap % 2 == 0 else count - 1 - pos
    return shards


def shard_positions(material_ids: Sequence[str], natoms: Sequence[int], shard: Shard) -> list[int]:
    """Positions (in input order) of the structures that ``shard`` relaxes."""
    return [k for k, s in enumerate(assign_shards(material_ids, natoms, shard.count)) if s == shard.index]


__all__ = ["Shard", "resolve_shard", "assign_shards", "shard_positions"]
