"""Data pipeline at OMat24 scale: cache build rate, loader rate, and the margin over a GPU's step rate.

    python -m benchmarks.data_throughput --json benchmarks/results/data_throughput_cpu.json
    python -m benchmarks.data_throughput --smoke          # a few thousand structures, a minute

1. Writes a synthetic OMat24-like dataset (``matris.data.synthetic.omat_like_atoms``: small
   bulk cells over the periodic table, ~10 atoms each, random labels) as ASE-LMDB files, the
   format OMat24 ships in.
2. Builds the graph cache as the recipes do (``cache_angles: false``, bonds only) with 1
   worker on one file and with all ``--workers`` on the whole set: structures/s, and the
   per-worker rate extrapolated to 32 workers (linear, with the measured 1 → N efficiency).
3. Loader rate: the training DataLoader of ``MatRISDataModule`` (memory-mapped shards,
   line graph rebuilt per batch, budget batches of ``--batch`` structures) with 0, 1, ...
   ``--workers`` worker processes: structures/s in steady state.
4. The model side, 10M architecture: the FLOPs of one training step (forward, forces and
   stress by a double backward, loss backward) counted by ``torch.utils.flop_counter`` per
   structure, and the CPU time per structure measured here. A GPU step cannot take less than
   FLOPs / peak: at the H200's dense TF32 tensor peak (494 TFLOP/s) that bounds the GPU's
   rate from above. The loader keeps up when 8 workers deliver more structures per second
   than this bound; the margin reported is (8 × per-worker loader rate) / (GPU bound).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, provenance

H200_TF32_DENSE = 494e12  # FLOP/s, NVIDIA H200 (= H100 SXM) TF32 tensor-core peak without sparsity
H200_FP32 = 67e12  # FLOP/s, non-tensor FP32 peak


def _write_part(args: tuple[str, int, int]) -> str:
    from matris.data.synthetic import write_omat_like_lmdb

    path, n, seed = args
    return str(write_omat_like_lmdb(path, n, seed=seed))


def write_dataset(folder: Path, n: int, files: int, procs: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    per = [n // files + (k < n % files) for k in range(files)]
    jobs = [(str(folder / f"part-{k:03d}.aselmdb"), per[k], 1000 + k) for k in range(files)]
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        return [Path(p) for p in pool.map(_write_part, jobs)]


def _dataset(files: list[Path]) -> dict:
    return {"name": "omat-like", "train": [str(f) for f in files], "labels": ["energy", "forces", "stress"]}


def build_rates(files: list[Path], workers: int, cache: Path, shard_size: int) -> list[dict]:
    """Cold builds as ``matris data build`` makes them (so the loader below reuses the entries)."""
    from matris.data import build_or_load
    from matris.train.config import DatasetConfig
    from matris.train.datamodule import reader_options

    options = reader_options(DatasetConfig.from_value(_dataset(files), "benchmark"))

    rows = []
    for w, chosen in ((1, files[:1]), (workers, files)):
        if w == 1 and workers == 1 and len(files) == 1:
            continue
        t0 = time.perf_counter()
        n = 0
        for f in chosen:
            ds = build_or_load(f, 6.0, 4.5, cache_dir=cache / f"w{w}", store_angles=False, workers=w,
                               shard_size=shard_size, progress=False, reader_options=options)
            n += len(ds)
        seconds = time.perf_counter() - t0
        rows.append({"workers": w, "structures": n, "seconds": seconds, "structures_per_s": n / seconds})
        print(f"cache build, {w} worker(s): {n} structures in {seconds:.1f} s = {n / seconds:.0f} structures/s")
    return rows


def loader_rates(files: list[Path], cache: Path, workers: int, batch: int, batches: int) -> list[dict]:
    from matris.train import TrainConfig
    from matris.train.datamodule import MatRISDataModule

    rows = []
    for w in range(workers + 1):
        config = TrainConfig.from_dict({"data": {
            "datasets": [_dataset(files)],
            "val_fraction": 0.0, "cache_dir": str(cache), "cache_angles": False, "max_structures": batch,
            "num_workers": w, "build_workers": workers}})
        dm = MatRISDataModule(config.data, 6.0, 4.5)
        dm.setup("fit")
        loader = dm.train_dataloader()
        it = iter(loader)
        for _ in range(max(3, 2 * w)):  # workers started and their first batches out of the way
            next(it)
        t0 = time.perf_counter()
        n = atoms = angles = 0
        for _ in range(batches):
            b = next(it)
            n += b.graph.num_structures if hasattr(b.graph, "num_structures") else len(b.graph.n_atoms)
            atoms += int(b.graph.n_atoms.sum())
            angles += int(b.graph.n_angles.sum())
        seconds = time.perf_counter() - t0
        del it, loader
        rows.append({"loader_workers": w, "batches": batches, "structures": n, "seconds": seconds,
                     "structures_per_s": n / seconds, "atoms_per_structure": atoms / n,
                     "angles_per_structure": angles / n})
        print(f"loader, {w} worker(s): {n / seconds:8.0f} structures/s ({atoms / n:.1f} atoms, "
              f"{angles / n:.0f} angles per structure; line graph rebuilt per batch)")
    return rows


def model_cost(files: list[Path], cache: Path, batch: int, steps: int) -> dict:
    """FLOPs and CPU seconds per structure of a 10M training step on batches of the dataset."""
    import yaml
    from torch.utils.flop_counter import FlopCounterMode

    from matris.train import TrainConfig
    from matris.train.datamodule import MatRISDataModule
    from matris.train.loss import compute_loss
    from matris.train.run import build_model

    recipe = yaml.safe_load((ROOT / "examples/configs/matris-10m-omat.yaml").read_text())
    config = TrainConfig.from_dict({"model": recipe["model"], "loss": recipe["loss"], "data": {
        "datasets": [_dataset(files[:1])],
        "val_fraction": 0.0, "cache_dir": str(cache), "cache_angles": False, "max_structures": batch,
        "build_workers": 1}})
    model = build_model(config).train()  # float32, as trainer.precision 32
    dm = MatRISDataModule(config.data, model.cutoff, model.three_body_cutoff)
    dm.setup("fit")
    sampler = dm._sampler(dm.train_set, True, 0, 1)
    from matris.train.datamodule import Collate

    collate = Collate(dm.train_set)
    batches = [collate(b) for b, _ in zip(sampler, range(steps + 1))]

    def step(b) -> None:
        out = model(b.graph, compute_forces=True, compute_stress=True, compute_magmoms=False, create_graph=True)
        loss, _, _ = compute_loss(out, b.targets, b.graph.n_atoms, config.loss)
        loss.backward()
        model.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        step(batches[0])
    flops = counter.get_total_flops()
    n0 = len(batches[0].graph.n_atoms)
    t0 = time.perf_counter()
    n = 0
    for b in batches[1:]:
        step(b)
        n += len(b.graph.n_atoms)
    seconds = time.perf_counter() - t0
    return {"params": sum(p.numel() for p in model.parameters()), "flops_per_structure": flops / n0,
            "cpu_seconds_per_structure": seconds / n, "cpu_threads": torch.get_num_threads(),
            "structures_timed": n, "dtype": "float32"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--structures", type=int, default=200_000, help="size of the synthetic dataset")
    p.add_argument("--files", type=int, default=4, help="ASE-LMDB files it is written to")
    p.add_argument("--workers", type=int, default=2, help="most build and loader workers measured")
    p.add_argument("--shard-size", type=int, default=5000)
    p.add_argument("--batch", type=int, default=32, help="structures per batch (the OMat recipe's per-GPU batch)")
    p.add_argument("--batches", type=int, default=200, help="batches timed per loader setting")
    p.add_argument("--model-steps", type=int, default=2, help="10M training steps timed on CPU")
    p.add_argument("--model-batch", type=int, default=1, help="structures per timed 10M step on CPU (memory)")
    p.add_argument("--smoke", action="store_true", help="a small run (a minute)")
    p.add_argument("--data-dir", default=None, help="keep the generated data and caches here (default: a temp dir)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.structures, args.files, args.batches, args.shard_size, args.model_steps = 2000, 2, 20, 500, 1
    torch.set_num_threads(1)
    meta = provenance(argv)  # at the start: the commit the run measures
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir) if args.data_dir else Path(tmp)
        t0 = time.perf_counter()
        files = write_dataset(root / "omat-like", args.structures, args.files, args.workers)
        print(f"wrote {args.structures} OMat-like structures to {len(files)} ASE-LMDB files in "
              f"{time.perf_counter() - t0:.0f} s")
        cache = root / "cache"
        build = build_rates(files, args.workers, cache, args.shard_size)
        loader = loader_rates(files, cache / f"w{args.workers}", args.workers, args.batch, args.batches)
        model = model_cost(files, cache / "w1", args.model_batch, args.model_steps)
    per_worker_build = build[0]["structures_per_s"]
    eff_build = build[-1]["structures_per_s"] / (build[-1]["workers"] * per_worker_build)
    # per worker: the 1-worker loader (collate in a worker process, batches sent to the trainer);
    # 8 workers on a GPU node's own cores are extrapolated linearly from it
    per_worker_loader = next(r["structures_per_s"] for r in loader if r["loader_workers"] == 1)
    loader_8 = 8 * per_worker_loader
    gpu_bound = H200_TF32_DENSE / model["flops_per_structure"]
    gpu_bound_fp32 = H200_FP32 / model["flops_per_structure"]
    summary = {
        "build_structures_per_s_1_worker": per_worker_build,
        "build_scaling_efficiency": eff_build,
        "build_structures_per_s_32_workers_extrapolated": 32 * per_worker_build * min(1.0, eff_build),
        "omat24_build_hours_32_workers": 101e6 / (32 * per_worker_build * min(1.0, eff_build)) / 3600,
        "loader_structures_per_s_per_worker": per_worker_loader,
        "collate_structures_per_s_in_process": loader[0]["structures_per_s"],
        "loader_structures_per_s_8_workers_extrapolated": loader_8,
        "gpu_structures_per_s_upper_bound_tf32_peak": gpu_bound,
        "gpu_structures_per_s_upper_bound_fp32_peak": gpu_bound_fp32,
        "margin_8_workers_vs_tf32_peak_bound": loader_8 / gpu_bound,
        "margin_8_workers_vs_fp32_peak_bound": loader_8 / gpu_bound_fp32,
    }
    print(f"\n10M training step: {model['flops_per_structure'] / 1e9:.1f} GFLOP per structure; "
          f"{model['cpu_seconds_per_structure']:.2f} s per structure on 1 CPU thread (float32)")
    print(f"cache build: {per_worker_build:.0f} structures/s per worker, {eff_build:.0%} efficient at "
          f"{build[-1]['workers']} workers -> {summary['build_structures_per_s_32_workers_extrapolated']:.0f}/s at 32 "
          f"workers: OMat24 (101 M) in {summary['omat24_build_hours_32_workers']:.1f} h")
    print(f"loader: {per_worker_loader:.0f} structures/s per worker -> {loader_8:.0f}/s with 8 workers")
    print(f"H200 upper bound on the 10M step rate: {gpu_bound:.0f} structures/s at the TF32 peak, "
          f"{gpu_bound_fp32:.0f} at the FP32 peak")
    print(f"margin of 8 loader workers: {summary['margin_8_workers_vs_tf32_peak_bound']:.1f}x the TF32-peak bound, "
          f"{summary['margin_8_workers_vs_fp32_peak_bound']:.1f}x the FP32-peak bound")
    result = {"meta": {**meta, "threads_per_process": 1, "structures": args.structures,
                       "files": args.files, "batch": args.batch},
              "build": build, "loader": loader, "model_10m": model, "summary": summary}
    if args.json:
        from benchmarks.common import write_json

        write_json(args.json, result)
    return 0 if all(math.isfinite(v) for v in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
