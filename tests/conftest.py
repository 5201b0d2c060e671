import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from matris import AtomicSystem, GraphBatch, MatRIS
from matris.kernels import native
from matris.pretrained import transfer

# The fused CPU loops are compiled once for the whole run: tests and their subprocesses that point
# MATRIS_CACHE at a private folder share one build instead of compiling it again each time.
os.environ.setdefault("MATRIS_NATIVE_CACHE", str(native.cache_root()))

FIXTURES = Path(__file__).parent / "fixtures" / "official-v0.9"
# A 2-block, width-32 MatRIS with random weights (the package's first demo model): mechanics
# tests (relaxation, MD bookkeeping, conservation) use it because it is fast and its numbers are
# pinned in those tests; the bundled distilled model has its own tests (test_bundled.py).
RANDOM_TINY = Path(__file__).parent / "fixtures" / "random-tiny.pth.tar"
FOLDERS = ["small_sh_float64", "small_fourier_float64", "mixed_widths_float64", "small_sh_float32"]


def load_reference(folder: str) -> dict:
    return json.loads((FIXTURES / folder / "reference.json").read_text())


def load_fixture_model(folder: str, dtype=torch.float64) -> MatRIS:
    return MatRIS.from_checkpoint(FIXTURES / folder / "checkpoint.pth.tar").to(dtype)


def evaluate(model: MatRIS, systems, **kw):
    """Model output for a list of AtomicSystems in the model's dtype."""
    g = GraphBatch.from_systems(list(systems), model.cutoff, model.three_body_cutoff, dtype=model.dtype)
    return model(g, **kw), g


@pytest.fixture(scope="session")
def model64() -> MatRIS:
    return load_fixture_model("small_sh_float64")


@pytest.fixture(scope="session")
def fourier64() -> MatRIS:
    return load_fixture_model("small_fourier_float64")


def random_system(rng, n=6, a=4.2, z=(14, 8, 26), pbc=True, rattle=0.25) -> AtomicSystem:
    """A random triclinic cell with atoms on a jittered grid (no two atoms closer than ~1 Å)."""
    cell = np.eye(3) * a + rng.normal(scale=0.3, size=(3, 3))
    grid = np.stack(np.meshgrid(*[np.arange(2)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n] / 2
    frac = grid + rng.normal(scale=rattle / a, size=grid.shape)
    numbers = rng.choice(z, size=n)
    return AtomicSystem(frac @ cell, cell, pbc, numbers, "random")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private model cache; downloads without waits between retries; no offline mode leaking in."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("MATRIS_CACHE", str(folder))
    monkeypatch.delenv("MATRIS_OFFLINE", raising=False)
    monkeypatch.setattr(transfer, "DEFAULTS", transfer.DownloadSettings(timeout=10, backoff=0))
    return folder


class OperatorLog:
    """A torch dispatch mode that records the ``matris::*`` operators that run (name → calls, and
    each call's arguments): which fused kernels a model call took."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._schema.name
                if name.startswith("matris::"):
                    log.calls.setdefault(name.split("::")[1], []).append(args)
                return func(*args, **(kwargs or {}))

        self.calls = {}
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)

    def counts(self) -> dict:
        return {name: len(args) for name, args in self.calls.items()}


def profiled_operator_counts(fn) -> dict:
    """``fn()`` under the profiler → the number of calls of each ``matris::*`` operator (also
    inside compiled graphs, where a dispatch mode would change what is traced)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key.split("::")[1]: e.count for e in prof.key_averages() if e.key.startswith("matris::")}
