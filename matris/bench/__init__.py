"""Speed benchmarks: energy + forces + stress throughput, MD speed and peak memory of MatRIS,
side by side with CHGNet, SevenNet, MACE and MatterSim where they are installed.

    from matris.bench import BenchConfig, run_bench, format_table
    result = run_bench(BenchConfig(sizes=[8, 64, 512], compare=["chgnet"], md_steps=20))
    print(format_table(result))

``matris bench`` runs the same from the command line. Modules: :mod:`.structures` (the
standard ladders and user files), :mod:`.runners` (one adapter per potential),
:mod:`.measure` (timing, MD speed, peak memory), :mod:`.suite` (the run),
:mod:`.results` (what was measured) and :mod:`.report` (table, JSON, CSV, plot).
"""

from .report import format_table, plot, write_csv, write_json
from .results import BenchResult, BenchRow, ModelStatus
from .structures import DEFAULT_SIZES, BenchStructure, read_bench_structures, standard_structure, standard_structures
from .suite import BenchConfig, run_bench

__all__ = ["BenchConfig", "BenchResult", "BenchRow", "BenchStructure", "DEFAULT_SIZES", "ModelStatus",
           "format_table", "plot", "read_bench_structures", "run_bench", "standard_structure", "standard_structures",
           "write_csv", "write_json"]
