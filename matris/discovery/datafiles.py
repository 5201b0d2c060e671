"""The Matbench-Discovery data files: where matbench-discovery publishes them (Figshare), their
md5 checksums, and a verified download into the matris cache.

URLs, file names and md5 sums are those of matbench-discovery's ``data-files.yml`` (the
current release of the Figshare article 22715158). Files are downloaded with the resumable,
locked downloader of :mod:`matris.pretrained` to ``$MATRIS_CACHE/matbench-discovery/PATH``
(default ``~/.cache/matris``) and checked against their md5 before they get their final name;
``MATRIS_OFFLINE=1`` forbids downloads (cached files are still used).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import MatRISInputError, OfflineError, VerificationError

FIGSHARE_ARTICLE = "https://figshare.com/articles/dataset/22715158"


@dataclass(frozen=True)
class DataFile:
    """One published data file.

    key: its name in matbench-discovery's ``data-files.yml``; url: the published URL;
    path: where it goes under the cache folder (matbench-discovery's relative path);
    md5: its published md5 (None: not published, not checked); description: what it holds.
    """

    key: str
    url: str
    path: str
    md5: str | None
    description: str = ""

    @property
    def download_url(self) -> str:
        """The URL actually fetched: Figshare's API download endpoint for Figshare file URLs
        (what matbench-discovery does, as the web URLs may answer with a browser check)."""
        match = re.match(r"https://(?:ndownloader\.)?figshare\.com/(?:ndownloader/)?files/(\d+)", self.url)
        return f"https://api.figshare.com/v2/file/download/{match.group(1)}" if match else self.url


DATA_FILES: dict[str, DataFile] = {f.key: f for f in (
    DataFile("wbm_summary", "https://figshare.com/files/64706751", "wbm/2023-12-13-wbm-summary.csv.gz",
             "1555268d3aa59d20262cb9d01ce0994b",
             "WBM test set: DFT formation energies, MP-hull distances (MP2020-corrected), unique-prototype flags"),
    DataFile("wbm_initial_atoms", "https://figshare.com/files/48169597", "wbm/2024-08-04-wbm-initial-atoms.extxyz.zip",
             "2a292211ca6acb30ed8416178d644098", "WBM initial (unrelaxed) structures, one extxyz per material"),
    DataFile("wbm_initial_structures", "https://figshare.com/files/53161835",
             "wbm/2022-10-19-wbm-init-structs.jsonl.gz",
             "b809f101dd42a745ec2baabe7eb16f11", "WBM initial structures as pymatgen Structures (JSON lines)"),
    DataFile("wbm_computed_structure_entries", "https://figshare.com/files/53161832",
             "wbm/2022-10-19-wbm-computed-structure-entries.jsonl.gz", "655b7a9c368e136dd8747f1ef8002e7a",
             "WBM DFT ComputedStructureEntries: the calculation parameters MP2020 corrections need"),
    DataFile("mp_elemental_ref_entries", "https://figshare.com/files/40387775",
             "mp/2023-02-07-mp-elemental-reference-entries.json.gz", "6e93b6f38d6e27d6c811d3cafb23a070",
             "lowest-energy MP entry of every element: the formation-energy references"),
    DataFile("mp_computed_structure_entries", "https://figshare.com/files/40344436",
             "mp/2023-02-07-mp-computed-structure-entries.json.gz", "76fc748db6b175bb80de4c276d27c235",
             "every MP ComputedStructureEntry (2023-02-07): the entries of the MP convex hull"),
    DataFile("wbm_relaxed_atoms", "https://figshare.com/files/48169600", "wbm/2024-08-04-wbm-relaxed-atoms.extxyz.zip",
             "4726643ac0dfbab69a4284454c891e68", "WBM DFT-relaxed structures: the references of the RMSD metric"),
    DataFile("wbm_dft_geo_opt_symprec_1e_2", "https://figshare.com/files/52066799",
             "data/wbm/dft-geo-opt-symprec=1e-2-moyo=0.3.1.csv.gz", "df60953f55755cea62e6df880ece07d9",
             "symmetry of the WBM DFT-relaxed structures (moyopy 0.3.1, symprec 1e-2)"),
    DataFile("phonondb_pbe_103_structures", "https://figshare.com/files/52179965",
             "phonons/2024-11-09-phononDB-PBE-103-structures.extxyz", "0b149802835e260aa3ab0c7e3c88625b",
             "the κ task's 103 PhononDB PBE unit cells with their supercells and q-meshes"),
    DataFile("phonondb_pbe_103_kappa_no_nac", "https://figshare.com/files/59988539",
             "phonons/2024-11-09-kappas-phononDB-PBE-noNAC.json.gz", "70c7a8b0df4cbb4d98f12aea5f61aeee",
             "the κ task's DFT conductivities (PBE, no non-analytical correction)"),
)}


def data_dir() -> Path:
    """``matbench-discovery`` under the matris cache folder (``$MATRIS_CACHE``)."""
    from ..pretrained import cache_dir

    return cache_dir() / "matbench-discovery"


def md5_file(path: str | os.PathLike) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verified(path: Path, md5: str | None) -> bool:
    """Whether ``path`` matches ``md5``; a match is remembered in ``PATH.md5`` (with the file's
    size and mtime), so an unchanged file is not hashed again."""
    if md5 is None:
        return True
    marker = path.with_name(path.name + ".md5")
    try:
        if json.loads(marker.read_text()) == {"md5": md5, **_stamp(path)}:
            return True
    except (OSError, ValueError):
        pass
    if md5_file(path) != md5:
        return False
    from ..atomic import write_json

    write_json(marker, {"md5": md5, **_stamp(path)}, indent=None)
    return True


def fetch_data_file(file: DataFile | str, *, force: bool = False, progress: bool | None = None,
                    directory: str | os.PathLike | None = None) -> Path:
    """The local copy of a published data file (a key of :data:`DATA_FILES` or a
    :class:`DataFile`), downloaded and md5-checked if needed.

    A cached file that fails its md5 is downloaded again. An interrupted download resumes.
    Concurrent processes (e.g. SLURM array tasks) wait for one download. Raises
    :class:`OfflineError` when the file is missing and ``MATRIS_OFFLINE=1``, and
    :class:`VerificationError` when the downloaded file's md5 is not the published one.
    """
    from ..pretrained import check_url, fetch_to_part, file_lock, is_offline

    if isinstance(file, str):
        if file not in DATA_FILES:
            raise MatRISInputError(f"unknown data file {file!r}; known: {', '.join(DATA_FILES)}")
        file = DATA_FILES[file]
    path = Path(directory) if directory is not None else data_dir()
    path = path / file.path
    if path.exists() and not force and _verified(path, file.md5):
        return path
    if is_offline():
        raise OfflineError(f"{file.key} ({path}) is {'corrupt' if path.exists() else 'not cached'} and "
                           f"MATRIS_OFFLINE=1 disables downloads; unset MATRIS_OFFLINE, or download {file.url} "
                           f"yourself and put it at {path}")
    check_url(file.download_url)
    progress = _is_tty() if progress is None else progress
    lock = path.with_name(path.name + ".lock")
    with file_lock(lock, f"waiting for another process downloading {file.key} (lock {lock})"):
        if path.exists() and not force and _verified(path, file.md5):
            return path  # another process fetched it while we waited
        path.unlink(missing_ok=True)
        for attempt in (1, 2):
            part, resumed = fetch_to_part(file.download_url, path, progress=progress, label=path.name)
            actual = md5_file(part)
            if file.md5 is None or actual == file.md5:
                break
            part.unlink(missing_ok=True)
            if not resumed or attempt == 2:  # a resumed file may hold bytes of an older version: once more, from 0
                raise VerificationError(
                    f"{file.key} downloaded from {file.download_url} has md5 {actual}, not the published "
                    f"{file.md5}; it was deleted and nothing was cached. Try again; if it fails again the file on "
                    f"Figshare has changed ({FIGSHARE_ARTICLE}): update matris or report it"
                )
        os.replace(part, path)
        if file.md5 is not None:
            _verified(path, file.md5)
    return path


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def resolve_data_file(value: str | os.PathLike | None, key: str, *, progress: bool | None = None) -> Path:
    """A data file given on the command line: a path, or None / the key / "auto" for the
    published file (fetched into the cache)."""
    if value is None or str(value) in ("auto", key):
        return fetch_data_file(key, progress=progress)
    path = Path(value).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no file {path} (give a path, or omit it to use the published {key})")
    return path


__all__ = ["DataFile", "DATA_FILES", "data_dir", "fetch_data_file", "resolve_data_file", "md5_file",
           "FIGSHARE_ARTICLE"]
