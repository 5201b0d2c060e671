"""Matbench-Discovery with MatRIS: relax the WBM test set (sharded, resumable, batched on a GPU),
then compute formation energies, hull distances and the benchmark's metrics.

- :mod:`~matris.discovery.shards`: ``--shard I/N`` and the deterministic assignment.
- :mod:`~matris.discovery.store`: per-shard JSON-lines results, manifest, merge.
- :mod:`~matris.discovery.relax`: the relaxation protocol and engines.
- :mod:`~matris.discovery.datafiles` / :mod:`~matris.discovery.readers`: the published data
  files (md5-checked downloads) and how they are read.
- :mod:`~matris.discovery.energy`: MP2020 corrections, formation energies, hulls.
- :mod:`~matris.discovery.metrics`: matbench-discovery's metric definitions.
- :mod:`~matris.discovery.predictions`, :mod:`~matris.discovery.evaluate`,
  :mod:`~matris.discovery.plots`: the outputs.
"""

from .datafiles import DATA_FILES, DataFile, fetch_data_file
from .energy import HullReference, formation_energy_per_atom, mp2020_corrected_energies
from .evaluate import MetricsRun, evaluate, run_metrics
from .metrics import DiscoveryMetrics, classify_stable, discovery_metrics, stable_metrics
from .predictions import Predictions, predict
from .readers import read_elemental_refs, read_entries, read_hull_entries, read_structures, read_summary
from .relax import RelaxProtocol, ShardReport, relax_shard
from .shards import Shard, assign_shards, resolve_shard
from .store import MergedResults, RelaxRecord, merge_results, read_records

__all__ = [
    "DATA_FILES", "DataFile", "fetch_data_file", "HullReference", "formation_energy_per_atom",
    "mp2020_corrected_energies", "MetricsRun", "evaluate", "run_metrics", "DiscoveryMetrics", "classify_stable",
    "discovery_metrics", "stable_metrics", "Predictions", "predict", "read_elemental_refs", "read_entries",
    "read_hull_entries", "read_structures", "read_summary", "RelaxProtocol", "ShardReport", "relax_shard", "Shard",
    "assign_shards", "resolve_shard", "MergedResults", "RelaxRecord", "merge_results", "read_records",
]
