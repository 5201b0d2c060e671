"""How the ``matris`` command's CPU threads wait: the policy for a machine that runs more than one job.

PyTorch's CPU operators and matris's fused kernels run their loops on an OpenMP team. With
GNU OpenMP's default (``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` unset) a thread that finishes
its share of a loop keeps its core busy, spinning 300,000 times (0.1 to 20 ms, by CPU) before it
sleeps, so that the next loop starts without a wake-up. Alone on a machine that costs nothing.
Beside another process that does the same, each team's spinning threads take the cores the
other's working threads wait for, and every loop waits a scheduler time slice: an 8-atom
``matris md`` beside a ``matris finetune`` on 2 cores ran tens of times slower than alone, and so
did the training (``benchmarks/results/shared_machine_cpu.json``).

So the command, before torch is imported, asks its threads to sleep when they wait
(``OMP_WAIT_POLICY=PASSIVE``), unless the user has set a policy of their own
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or Intel OpenMP's ``KMP_BLOCKTIME``): then theirs holds.
Alone, small pieces of work pay for the wake-ups (the bundled model's 8-atom MD and fine-tune 14-24 %,
the published model nothing measurable); the measured cost and gain are in docs/performance.md
("A shared machine"), with how to bring the spinning back. A Python script
chooses its own: ``OMP_WAIT_POLICY=PASSIVE python script.py`` (it must be set before torch is
imported; the variable is read once, when the OpenMP runtime loads).
"""

from __future__ import annotations

import os
from typing import MutableMapping

# the variables by which a user states a wait policy of their own
USER_POLICY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
DEFAULT = {"OMP_WAIT_POLICY": "PASSIVE"}


def set_wait_policy(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Give ``environ`` (default ``os.environ``) the command's wait policy unless it states one;
    returns what was set (``{}`` when the user's policy holds). Takes effect only before the
    OpenMP runtime loads, i.e. before ``import torch``."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name, "").strip() for name in USER_POLICY):
        return {}
    environ.update(DEFAULT)
    return dict(DEFAULT)


__all__ = ["DEFAULT", "USER_POLICY", "set_wait_policy"]
