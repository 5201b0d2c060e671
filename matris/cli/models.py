"""``matris models`` (list the pretrained models and the cache) and ``matris download``."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "list the pretrained models: what is cached and where"
DESCRIPTION = """\
List the pretrained models MatRIS.load() and --model accept by name: parameters, training
data, Matbench-Discovery metrics, license, and whether each is bundled, cached (with its
path and size) or still to be downloaded. Names accept - or _ and any case.

The cache is $MATRIS_CACHE, else $XDG_CACHE_HOME/matris, else ~/.cache/matris. With
MATRIS_OFFLINE=1 nothing is downloaded.

  matris models
  matris models --json
"""

DOWNLOAD_HELP = "download pretrained models into the cache (verified) and print their paths"
DOWNLOAD_DESCRIPTION = """\
Download pretrained models by name (see 'matris models') into the cache and print the path
of each file, one a line. A download resumes where an interrupted one stopped, is retried on
network errors, and is verified (sha256, or config and parameter count) before it is stored;
a cached file is checked and fetched again if it is corrupt. An https:// URL is accepted too.

  matris download matris-10m-oam
  matris download matris_10m_mp matris-10m-oam --force
"""

METRIC_LABELS = {"F1": "F1", "kappa_SRME": "κ_SRME", "RMSD": "RMSD"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def add_download_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", metavar="NAME", help="model names (or https:// URLs)")
    p.add_argument("--force", action="store_true", help="download again even if an intact copy is cached")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                     help="always show a progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="never show one")


def run(args: argparse.Namespace) -> int:
    from ..pretrained import cache_dir, is_offline, list_models

    models = list_models()
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir()), "offline": is_offline(), "models": models}, indent=1))
        return 0
    print(f"cache: {cache_dir()}{'  (MATRIS_OFFLINE=1: no downloads)' if is_offline() else ''}")
    for m in models:
        print()
        aliases = f"  (also: {', '.join(m['aliases'])})" if m["aliases"] else ""
        print(f"{m['name']}{aliases}")
        facts = [f"{m['num_params']:,} parameters" if m["num_params"] else None, m["training_data"] or None,
                 m["license"]]
        print("    " + " · ".join(f for f in facts if f))
        if m["metrics"]:
            metrics = ", ".join(f"{METRIC_LABELS.get(k, k)} {v}" for k, v in m["metrics"].items())
            print(f"    {m['benchmark'] or 'metrics'}: {metrics}")
        if m["description"]:
            print(f"    {m['description']}")
        print(f"    {_status(m)}")
    print("\nLoad one with MatRIS.load(NAME) or --model NAME; fetch ahead with 'matris download NAME'.")
    return 0


def _status(m: dict) -> str:
    if m["status"] == "bundled":
        return f"bundled: {m['path']} ({_size(m['size_bytes'])})"
    if m["status"] == "cached":
        return f"cached: {m['path']} ({_size(m['size_bytes'])})"
    if m["status"] == "unavailable":
        return "not available: no public download URL yet"
    return f"not cached (downloads from {m['url']} to {m['path']})"


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def run_download(args: argparse.Namespace) -> int:
    from ..pretrained import download

    for name in args.names:
        path = download(name, force=args.force, progress=args.progress)
        print(path)
        sys.stdout.flush()
    return 0
