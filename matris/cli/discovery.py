"""``matris discovery``: the Matbench-Discovery benchmark (relax the WBM test set, then score it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import counted
from .common import DEVICE_HELP, DTYPE_HELP

HELP = "Matbench-Discovery: relax the WBM test set (sharded, resumable) and compute its metrics"
DESCRIPTION = """\
The Matbench-Discovery benchmark in two steps (plus an optional download step):

  matris discovery relax --model NAME --out DIR [--shard I/N]
      relax the WBM initial structures (FIRE + FrechetCellFilter, fmax 0.05 eV/Å, 500 steps)
  matris discovery metrics --relaxed DIR
      MP2020 corrections, formation energies, hull distances, F1/DAF/…/MAE/R² on the full
      test set, the unique prototypes and the 10k most stable; predictions file, metrics
      table (metrics.json, metrics.csv) and figure (discovery.png)
  matris discovery download
      fetch the published data files into the cache (e.g. on a login node before a SLURM run)
  matris discovery kappa --model NAME --structures FILE --out DIR [--shard I/N]
      lattice thermal conductivity at 300 K (phono3py, Wigner RTA), sharded and resumable
  matris discovery kappa-metrics --pred DIR --true DIR
      κ_SRME, κ_SRE, κ_SRD of one κ run against a reference run
  matris discovery report --metrics DIR [--kappa-pred DIR --kappa-true DIR]
      F1, κ_SRME, RMSD and the combined score next to the published MatRIS figures, and κ figures

Run 'matris discovery <step> --help' for the options of a step.
"""

RELAX_DESCRIPTION = """\
Relax the WBM initial structures with the Matbench-Discovery protocol: FIRE on a
FrechetCellFilter until every atomic and cell force is below --fmax (0.05 eV/Å; 0.02 is also
common), at most --steps 500. On a GPU the structures are relaxed --batch-size at a time with
torch-sim's batched FIRE; on the CPU one by one with ASE (--engine picks).

Sharding: --shard I/N (0 <= I < N) relaxes shard I of N; structures are dealt to shards by
size, deterministically, so N processes, GPUs or SLURM array tasks cover every structure
exactly once. In a SLURM array --shard defaults to the task's (SLURM_ARRAY_TASK_ID -
SLURM_ARRAY_TASK_MIN of SLURM_ARRAY_TASK_COUNT).

Results: DIR/shard-I-of-N.jsonl, one line per structure (final energy in eV, relaxed cell and
positions, fmax, convergence), written as each finishes. Rerunning a killed shard continues
where it stopped. DIR/manifest.json records the settings; a shard started in DIR with other
settings is refused.

  matris discovery relax --model matris-10m-oam --out wbm-relax                  # one GPU
  for i in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$i matris discovery relax --model matris-10m-oam \\
      --out wbm-relax --shard $i/4 & done; wait                                   # four GPUs
  sbatch --array=0-99 --gres=gpu:1 --wrap "matris discovery relax --model matris-10m-oam --out wbm-relax"
  matris discovery relax --model demo --out quick --limit 20 --steps 50           # a quick test
"""

METRICS_DESCRIPTION = """\
Score a finished (or partial) relaxation run with matbench-discovery's definitions:

1. every relaxed structure replaces the structure and energy of its WBM DFT
   ComputedStructureEntry, and pymatgen's MaterialsProject2020Compatibility corrects it;
2. formation energy per atom against the MP elemental reference energies;
3. predicted hull distance = DFT hull distance + (predicted − DFT formation energy), or with
   --hull-entries the distance to the convex hull of those entries;
4. stable = hull distance <= --threshold (0 eV/atom); F1, DAF, precision, recall, accuracy,
   TPR/FPR/TNR/FNR, MAE, RMSE, R² on the full test set, the unique prototypes and the 10k
   unique prototypes predicted most stable. As on the leaderboard, values are rounded to
   3 decimals and predictions more than 5 eV/atom off count as missing.

Data files (WBM summary, WBM computed structure entries, MP elemental references) default to
the ones matbench-discovery publishes, downloaded once and md5-checked into the cache
($MATRIS_CACHE/matbench-discovery). Outputs in --out (default: the relax folder):
wbm-IS2RE-FIRE.csv.gz (material_id, e_form_per_atom_KEY, …), wbm-IS2RE-FIRE.jsonl.gz (relaxed
structures), metrics.json, metrics.csv, discovery.png.

  matris discovery metrics --relaxed wbm-relax
  matris discovery metrics --relaxed quick --only-predicted     # score a partial run on what it relaxed
"""


KAPPA_DESCRIPTION = """\
The κ task of Matbench Discovery (matris.discovery.kappa): for each unit cell of --structures
(info: material_id, fc2_supercell, fc3_supercell, q_mesh, as in the benchmark's PhononDB file),
a symmetry-constrained relaxation, force constants from 0.03 Å displacements (the displaced
supercells go through the model --batch-size at a time), the phonons (imaginary modes recorded)
and κ at 300 K from phono3py's Wigner transport equation. float64 by default.

Results: DIR/shard-I-of-N.jsonl, one line per structure, written as each finishes; a rerun skips
what is done (a killed run loses at most the structure in progress), a failed structure is
recorded with its reason. --shard I/N as for 'matris discovery relax' (SLURM arrays too).

  matris discovery kappa --model matris-10m-oam --structures phononDB-PBE-103.extxyz --out kappa
  matris discovery kappa-metrics --pred kappa --true kappa-dft
"""


def run_kappa(args: argparse.Namespace) -> int:
    from ..discovery.datafiles import DATA_FILES, resolve_data_file
    from .common import check_inputs

    model_name = args.model
    key = args.structures if args.structures in DATA_FILES else None
    check_inputs([] if key else [args.structures], None if model_name in ("demo", "bundled") else model_name)
    structures = resolve_data_file(None, key) if key else args.structures
    from ..discovery.kappa import KappaProtocol
    from ..discovery.kappa_run import run_shard
    from ..discovery.shards import resolve_shard
    from ..model import MatRIS

    model = MatRIS.load("matris-demo" if model_name in ("demo", "bundled") else model_name, device=args.device,
                        dtype=args.dtype)
    report = run_shard(structures, args.out, model, model_name, resolve_shard(args.shard),
                       KappaProtocol(batch_size=args.batch_size, fmax=args.fmax, max_steps=args.max_steps,
                                     displacement=args.displacement, symprec=args.symprec,
                                     relax_symprec=args.relax_symprec, method=args.method),
                       dtype=args.dtype, limit=args.limit,
                       retry_failed=args.retry_failed)
    print(f"shard {report['shard']}: {report['computed']} computed, {report['failed']} failed, {report['skipped']} "
          f"done before; results in {report['path']}", file=sys.stderr)
    if report["skipped"] and not report["computed"] and not report["failed"]:  # the rerun rule (matris.rerun)
        print(f"shard {report['shard']} was already complete in {report['path']}: nothing computed now "
              "(--retry-failed computes failed ones again; another --out folder starts afresh)", file=sys.stderr)
    return 0


def run_kappa_metrics(args: argparse.Namespace) -> int:
    import json

    from ..discovery.datafiles import DATA_FILES, resolve_data_file
    from ..discovery.kappa_run import compare

    true = resolve_data_file(None, args.true) if args.true in DATA_FILES else args.true
    m = compare(args.pred, true)
    print(f"| metric | value |\n|---|---:|\n| κ_SRME | {m['kappa_SRME']:.4f} |\n| κ_SRE | {m['kappa_SRE']:.4f} |\n"
          f"| κ_SRD | {m['kappa_SRD']:+.4f} |\n| materials | {m['materials']} |")
    if args.json:
        from ..atomic import write_json

        write_json(args.json, m)
        print(f"wrote {args.json}", file=sys.stderr)
    else:
        print(json.dumps({k: v for k, v in m.items() if k != "per_material"}), file=sys.stderr)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from ..atomic import write_json, write_text
    from ..discovery import report as rep

    kappa = None
    if (args.kappa_pred is None) != (args.kappa_true is None):
        print("matris discovery report: error: give both --kappa-pred and --kappa-true, or neither", file=sys.stderr)
        return 2
    if args.kappa_pred is not None:
        from ..discovery.datafiles import DATA_FILES, resolve_data_file
        from ..discovery.kappa_metrics import kappa_metrics
        from ..discovery.kappa_run import load_pair

        true = resolve_data_file(None, args.kappa_true) if args.kappa_true in DATA_FILES else args.kappa_true
        preds, trues, spg = load_pair(args.kappa_pred, true)  # read once: the metrics and the figure
        kappa = kappa_metrics(preds, trues, spg)
    report = rep.build(args.name, rep.gather(args.metrics, kappa))
    out = Path(args.out)
    text = rep.table(report)
    print(text)
    write_json(out / "report.json", report)
    write_text(out / "report.md", text + "\n")
    if kappa is not None:
        rep.kappa_figure(preds, trues, kappa["per_material"], out / "kappa.png", title=f"{args.name}: κ at 300 K")
    print(f"wrote {out / 'report.json'}, {out / 'report.md'}" + (f", {out / 'kappa.png'}" if kappa else ""),
          file=sys.stderr)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    steps = p.add_subparsers(dest="discovery_step", metavar="<step>")
    relax = steps.add_parser("relax", help="relax the WBM initial structures (sharded, resumable)",
                             description=RELAX_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    relax.add_argument("--model", required=True, help="model name (see 'matris models'), checkpoint path, or 'demo'")
    relax.add_argument("--structures", default="wbm_initial_atoms",
                       help="structures file: WBM extxyz.zip / JSON(L) / any ASE format with info['material_id'] "
                            "(default: the published WBM initial structures, downloaded to the cache)")
    relax.add_argument("--out", required=True, help="results folder (shared by all shards of a run)")
    relax.add_argument("--shard", default=None, help="I/N: relax shard I (0-based) of N (default: the SLURM array "
                                                     "task's, else 0/1 = everything)")
    relax.add_argument("--fmax", type=float, default=0.05, help="force threshold, eV/Å (default: 0.05)")
    relax.add_argument("--steps", type=int, default=500, help="most optimizer steps (default: 500)")
    relax.add_argument("--device", default="auto", help=DEVICE_HELP)
    relax.add_argument("--dtype", default="float32", choices=["float32", "float64"], help=DTYPE_HELP)
    relax.add_argument("--engine", default="auto", choices=["auto", "ase", "torch-sim"],
                       help="auto: torch-sim batches on CUDA, ASE on the CPU (default: auto)")
    relax.add_argument("--batch-size", type=int, default=None,
                       help="structures relaxed and saved together (default: 256 with torch-sim, 1 with ASE)")
    relax.add_argument("--max-atoms", type=int, default=None, help="torch-sim: most atoms on the device at once")
    relax.add_argument("--limit", type=int, default=None, help="relax only the first N structures of the file")
    relax.add_argument("--retry-failed", action="store_true", help="relax again structures that failed before")
    relax.add_argument("--optimizer", default="FIRE", help="ASE optimizer (default: FIRE)")
    relax.add_argument("--cell-filter", default="FrechetCellFilter",
                       help="ASE cell filter (default: FrechetCellFilter)")
    relax.add_argument("--quiet", action="store_true", help="no progress bar")
    relax.set_defaults(discovery_run=run_relax)

    metrics = steps.add_parser("metrics", help="formation energies, hull distances and Matbench-Discovery metrics",
                               description=METRICS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    metrics.add_argument("--relaxed", required=True, help="the --out folder of 'matris discovery relax'")
    metrics.add_argument("--out", default=None, help="output folder (default: the --relaxed folder)")
    metrics.add_argument("--summary", default=None, help="WBM summary CSV (default: the published one)")
    metrics.add_argument("--entries", default=None,
                         help="WBM computed structure entries for MP2020 corrections (default: the published ones)")
    metrics.add_argument("--no-corrections", action="store_true",
                         help="skip MP2020 corrections (raw model energies; for models not fitted to MP2020 data)")
    metrics.add_argument("--elemental-refs", default=None,
                         help="elemental reference energies: {element: eV/atom or entry} JSON (default: the "
                              "published MP elemental reference entries)")
    metrics.add_argument("--hull-entries", default=None,
                         help="JSON of pymatgen entries: measure hull distances on their convex hull instead of "
                              "shifting the DFT ones")
    metrics.add_argument("--model-key", default="matris", help="name in the prediction columns (default: matris)")
    metrics.add_argument("--only-predicted", action="store_true",
                         help="test set = the materials with a prediction (default: the whole summary)")
    metrics.add_argument("--threshold", type=float, default=0.0, help="stability threshold, eV/atom (default: 0)")
    metrics.add_argument("--top-k", type=int, default=10_000, help="size of the most-stable subset (default: 10000)")
    metrics.add_argument("--no-round", action="store_true", help="do not round to 3 decimals first")
    metrics.add_argument("--dft-relaxed", default=None,
                         help="WBM DFT-relaxed structures (a file, or 'published' for wbm_relaxed_atoms): adds the "
                              "geometry metric (RMSD, symmetry match) over the relaxed unique prototypes, geo_opt.json")
    metrics.add_argument("--symprec", type=float, default=1e-2,
                         help="spglib tolerance of the symmetry comparison (default: 1e-2, the leaderboard's)")
    metrics.add_argument("--max-error", type=float, default=5.0,
                         help="predictions further than this from DFT (eV/atom) count as missing (default: 5)")
    metrics.set_defaults(discovery_run=run_metrics)

    download = steps.add_parser("download", help="fetch the published data files into the cache",
                                description="Download (once, md5-checked) the Matbench-Discovery data files into "
                                            "$MATRIS_CACHE/matbench-discovery, e.g. on a login node with internet "
                                            "before compute jobs that have none.")
    download.add_argument("keys", nargs="*", help="data files (default: the four the benchmark needs); "
                                                  "--list shows all")
    download.add_argument("--list", action="store_true", help="list the known data files")
    download.set_defaults(discovery_run=run_download)

    kappa = steps.add_parser("kappa", help="lattice thermal conductivity, the κ task (sharded, resumable)",
                             description=KAPPA_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    kappa.add_argument("--model", required=True, help="model name (see 'matris models'), checkpoint path, or 'demo'")
    kappa.add_argument("--structures", default="phonondb_pbe_103_structures",
                       help="unit cells with info material_id, fc2_supercell, fc3_supercell, q_mesh (extxyz, ...; "
                            "default: the benchmark's 103 PhononDB structures, downloaded to the cache)")
    kappa.add_argument("--out", required=True, help="results folder (shared by all shards of a run)")
    kappa.add_argument("--shard", default=None, help="I/N: shard I (0-based) of N (default: the SLURM array task's)")
    kappa.add_argument("--device", default="auto", help=DEVICE_HELP)
    kappa.add_argument("--dtype", default="float64", choices=["float32", "float64"],
                       help="model precision (default: float64: force constants are differences of forces)")
    kappa.add_argument("--batch-size", type=int, default=1,
                       help="displaced supercells per model call (default: 1, forces bitwise the benchmark's; "
                            "larger is faster, its ~1e-16 eV/Å differences can move κ by tenths of a percent)")
    # the defaults: Matbench Discovery's KappaSettings with its MatRIS yml's overrides (commit 2c7f9fc4)
    kappa.add_argument("--fmax", type=float, default=1e-5,
                       help="force threshold of the symmetry-constrained relaxation, eV/Å (default: 1e-5, the "
                            "benchmark's force_max for MatRIS)")
    kappa.add_argument("--max-steps", type=int, default=300, help="most relaxation steps (default: 300)")
    kappa.add_argument("--displacement", type=float, default=0.03,
                       help="finite displacement, Å (default: 0.03, the benchmark's for MatRIS)")
    kappa.add_argument("--symprec", type=float, default=1e-5,
                       help="space groups (moyopy) and phono3py's symmetry tolerance (default: 1e-5)")
    kappa.add_argument("--relax-symprec", type=float, default=0.01,
                       help="FixSymmetry's tolerance during the relaxation (default: 0.01)")
    kappa.add_argument("--method", default="MS-SMM19",
                       help="phono3py's Wigner transport type (default: MS-SMM19, the benchmark's; phono3py 3.30)")
    kappa.add_argument("--limit", type=int, default=None, help="only the first N structures of the file")
    kappa.add_argument("--retry-failed", action="store_true", help="compute again structures that failed before")
    kappa.set_defaults(discovery_run=run_kappa)

    km = steps.add_parser("kappa-metrics", help="κ_SRME, κ_SRE and κ_SRD of a κ run against a reference run",
                          description="Score the κ run in --pred against the reference run in --true (same format: "
                                      "the DFT set, or another model or precision) with the benchmark's definitions "
                                      "(matris.discovery.kappa_metrics): failed and missing materials count as 2.")
    km.add_argument("--pred", required=True, help="the --out folder of 'matris discovery kappa'")
    km.add_argument("--true", default="phonondb_pbe_103_kappa_no_nac",
                    help="the reference: another run's folder, or the benchmark's DFT κ file (default: the published "
                         "one, downloaded to the cache)")
    km.add_argument("--json", default=None, help="write the metrics and the per-material values to this file")
    km.set_defaults(discovery_run=run_kappa_metrics)

    rp = steps.add_parser("report", help="F1, κ_SRME, RMSD and the combined score next to the published figures",
                          description="One table (report.md, report.json) of the leaderboard's headline metrics for "
                                      "a model, F1 and RMSD from the output folder of 'matris discovery metrics' "
                                      "(RMSD where it ran with --dft-relaxed) and κ_SRME from two κ runs, with the "
                                      "combined performance score, next to the published MatRIS-10M-OAM figures; "
                                      "with κ runs also kappa.png (κ predicted vs reference, SRME distribution).")
    rp.add_argument("--metrics", default=None, help="output folder of 'matris discovery metrics'")
    rp.add_argument("--kappa-pred", default=None, help="the model's 'matris discovery kappa' folder")
    rp.add_argument("--kappa-true", default=None,
                    help="the reference: another κ run's folder, a DFT κ file, or phonondb_pbe_103_kappa_no_nac "
                         "(the published DFT κ, downloaded to the cache)")
    rp.add_argument("--name", default="this model", help="the model's name in the table")
    rp.add_argument("--out", default=".", help="folder for report.json, report.md and kappa.png (default: .)")
    rp.set_defaults(discovery_run=run_report)
    p.set_defaults(discovery_parser=p)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "discovery_run", None) is None:
        args.discovery_parser.print_help()
        return 0
    return int(args.discovery_run(args) or 0)


def run_relax(args: argparse.Namespace) -> int:
    from .common import check_inputs

    model = None if args.model in ("demo", "bundled") else args.model
    # a file given by path (not a published data key) and the model: checked before any heavy import
    given = Path(args.structures)
    check_inputs([args.structures] if given.suffix or given.parent != Path(".") or given.exists() else [], model)
    from ..discovery.datafiles import DATA_FILES, resolve_data_file
    from ..discovery.relax import RelaxProtocol, relax_shard
    from ..discovery.shards import resolve_shard

    shard = resolve_shard(args.shard)
    protocol = RelaxProtocol(fmax=args.fmax, steps=args.steps, optimizer=args.optimizer, cell_filter=args.cell_filter)
    key = args.structures if args.structures in DATA_FILES else None
    structures = resolve_data_file(None, key) if key else resolve_data_file(args.structures, "wbm_initial_atoms")
    report = relax_shard(structures, args.out, model=model, model_name=args.model, shard=shard, protocol=protocol,
                         engine=args.engine, device=args.device, dtype=args.dtype, batch_size=args.batch_size,
                         max_atoms=args.max_atoms, limit=args.limit, retry_failed=args.retry_failed,
                         progress=False if args.quiet else None)
    print(report.summary(), file=sys.stderr)
    if report.failed:
        print(f"{counted(report.failed, 'structure')} failed (recorded with their error in {report.path}); "
              "--retry-failed relaxes them again", file=sys.stderr)
    return 0


def run_metrics(args: argparse.Namespace) -> int:
    from ..discovery.datafiles import resolve_data_file
    from ..discovery.evaluate import run_metrics as compute

    summary = resolve_data_file(args.summary, "wbm_summary")
    entries = None if args.no_corrections else resolve_data_file(args.entries, "wbm_computed_structure_entries")
    refs = None
    if args.hull_entries is None or args.elemental_refs is not None:
        refs = resolve_data_file(args.elemental_refs, "mp_elemental_ref_entries")
    dft_relaxed = None
    if args.dft_relaxed is not None:
        dft_relaxed = resolve_data_file(None if args.dft_relaxed == "published" else args.dft_relaxed,
                                        "wbm_relaxed_atoms")
    out = compute(args.relaxed, args.out, summary=summary, entries=entries, elemental_refs=refs,
                  hull_entries=args.hull_entries, key=args.model_key, only_predicted=args.only_predicted,
                  stability_threshold=args.threshold, top_k=args.top_k, decimals=None if args.no_round else 3,
                  max_error=args.max_error, progress=sys.stderr.isatty(), dft_relaxed=dft_relaxed,
                  symprec=args.symprec)
    results = out.results
    print(out.metrics.table())
    if out.geometry is not None:
        g = out.geometry
        print(f"\ngeometry ({g['n_structures']} unique prototypes, symprec {g['symprec']:g}): RMSD {g['RMSD']:.4f}, "
              f"symmetry match {g['symmetry_match']:.3f}, decrease {g['symmetry_decrease']:.3f}, increase "
              f"{g['symmetry_increase']:.3f}, n_sym_ops MAE {g['n_sym_ops_mae']:.3f}")
    if results.missing:
        print(f"warning: {len(results.missing)} of {len(results.missing) + len(results)} structures of the run have "
              f"no result yet (e.g. {results.missing[:3]}); they count as missing predictions. Run the missing "
              "shards (rerun 'matris discovery relax' with the same options) to finish the run.", file=sys.stderr)
    if results.failed:
        print(f"warning: {counted(len(results.failed), 'relaxation')} failed (e.g. {results.failed[:3]}); they "
              "count as missing predictions (relax --retry-failed redoes them)", file=sys.stderr)
    if out.predictions.rejected:
        print(f"warning: MP2020 rejected {len(out.predictions.rejected)} entries (e.g. {out.predictions.rejected[:3]})",
              file=sys.stderr)
    for name, path in out.files.items():
        print(f"{name:13s} {path}", file=sys.stderr)
    return 0


NEEDED = ("wbm_initial_atoms", "wbm_summary", "wbm_computed_structure_entries", "mp_elemental_ref_entries")


def run_download(args: argparse.Namespace) -> int:
    from ..discovery.datafiles import DATA_FILES, fetch_data_file

    if args.list:
        for f in DATA_FILES.values():
            print(f"{f.key:32s} {f.path:58s} {f.url}\n{'':32s} {f.description}")
        return 0
    for key in args.keys or NEEDED:
        print(f"{key:32s} {fetch_data_file(key)}")
    return 0
