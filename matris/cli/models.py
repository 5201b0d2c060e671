"""``matris models`` (list the pretrained models and the cache) and ``matris download``."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "list the pretrained models: what is cached and where"
DESCRIPTION = """\
List the pretrained models MatRIS.load() and --model accept by name: the DFT functional and
data they were trained on, their targets (efsm: energy, forces, stress and magnetic moments;
efs: no magnetic moments), parameters, Matbench-Discovery F1, and whether each is bundled,
cached (with its path and size) or still to be downloaded. Names accept - or _ and any
case; the official package's keys (matris_10m_oam, matris_4m_matpes_r2scanv2, ...) work too.
--json adds download URLs (figshare's API, then the GitHub release), sha256 where published,
licences and descriptions.

The cache is $MATRIS_CACHE, else $XDG_CACHE_HOME/matris, else ~/.cache/matris. With
MATRIS_OFFLINE=1 nothing is downloaded.

  matris models
  matris models --json
"""

DOWNLOAD_HELP = "download pretrained models into the cache (verified) and print their paths"
DOWNLOAD_DESCRIPTION = """\
Download pretrained models by name (see 'matris models') into the cache and print the path
of each file, one a line. A download resumes where an interrupted one stopped, is retried on
network errors (and when a server answers with a page instead of the file), and is verified
(published size and sha256, else a strict load of the file's own architecture) before it is
stored; a cached file is checked and fetched again if it is corrupt. If every attempt fails
the error says where to fetch the file by hand and where to put it. An https:// URL is
accepted too.

  matris download matris-10m-oam
  matris download matris_10m_mp matris-10m-oam --force
"""



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def add_download_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", metavar="NAME", help="model names (or https:// URLs)")
    p.add_argument("--force", action="store_true", help="download again even if an intact copy is cached")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                     help="always show a progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="never show one")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="seconds to wait for the server to connect or send more data (default 30)")
    p.add_argument("--retries", type=int, default=5, metavar="N",
                   help="attempts after the first, 1, 2, 4, ... s apart; one that got new bytes does not count "
                        "(default 5)")


def run(args: argparse.Namespace) -> int:
    from ..pretrained import cache_dir, is_offline, list_models

    models = list_models(count=_parameters)
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir()), "offline": is_offline(), "models": models}, indent=1))
        return 0
    print(f"cache: {cache_dir()}{'  (MATRIS_OFFLINE=1: no downloads)' if is_offline() else ''}\n")
    header = ("name", "functional", "trained on", "targets", "params", "F1", "status")
    rows = [(m["name"], m["functional"] or "–", m["training_data"] or "–", m["targets"],
             f"{m['num_params']:,}" if m["num_params"] else "–",
             f"{m['metrics']['F1']:.3f}" if "F1" in m["metrics"] else "–", m["status"]) for m in models]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("\ntargets: e energy, f forces, s stress, m magnetic moments (efs models offer no magmoms).")
    print("F1: Matbench-Discovery (unique prototypes). Official keys (e.g. matris_10m_oam) work as names too.")
    here = [m for m in models if m["status"] in ("bundled", "cached")]
    if here:
        print("\non this machine:")
        for m in here:
            print(f"  {m['name']}: {m['path']} ({_size(m['size_bytes'])})")
    print("\nLoad one with MatRIS.load(NAME) or --model NAME; fetch ahead with 'matris download NAME';")
    print("'matris models --json' lists download URLs, hashes, licences and descriptions.")
    return 0


def _parameters(path) -> int | None:
    """The parameters of a cached checkpoint whose registry entry does not say."""
    from ..errors import CheckpointError
    from ..model import MatRIS

    try:
        return sum(p.numel() for p in MatRIS.from_checkpoint(path).parameters())
    except (CheckpointError, OSError):
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def run_download(args: argparse.Namespace) -> int:
    from ..pretrained import DownloadSettings, download
    from .common import check_checkpoint

    settings = DownloadSettings(timeout=args.timeout, retries=args.retries)
    for name in args.names:
        path = download(name, force=args.force, progress=args.progress, check=check_checkpoint, settings=settings)
        print(path)
        sys.stdout.flush()
    return 0
