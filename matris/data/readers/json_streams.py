"""What the JSON releases (MPtrj, MatPES) share: streaming with ijson from ``.json`` or
``.json.gz``, telling the layouts apart from the first frame, stream errors, and the fast
conversion of a pymatgen ``Structure.as_dict()``."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from ...errors import MatRISInputError
from ...extras import require
from ...graph.system import AtomicSystem, element_symbol
from .common import _first_line, _is_gz, _open_binary

_SYMBOL_TO_Z = {element_symbol(z): z for z in range(1, 119)}


def _json_first_char(p: Path) -> str:
    """The first non-whitespace character of a (gzipped) JSON file, without reading the rest."""
    try:
        with _open_binary(p) as f:
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    return ""
                chunk = chunk.lstrip()
                if chunk:
                    return chr(chunk[0])
    except (OSError, EOFError, zlib.error) as e:
        raise MatRISInputError(
            f"{p}: cannot read it{' as gzip' if _is_gz(p) else ''} ({type(e).__name__}: {_first_line(e)}); the file "
            "is corrupt or truncated. Re-download it."
        ) from e


def _ijson():
    """The ijson module (streamed JSON: MPtrj, MatPES), installed with the data extra."""
    return require("ijson", "data", "reading JSON datasets (MPtrj, MatPES)")


def _stream_errors() -> tuple[type[BaseException], ...]:
    ijson = _ijson()
    return (ijson.JSONError, EOFError, OSError, zlib.error, UnicodeDecodeError)


def _json_error(p: Path, k: int, after: str | None, e: BaseException) -> MatRISInputError:
    """A truncated or corrupt JSON stream, where record ``k`` should have started."""
    where = f" (after {after})" if after else ""
    return MatRISInputError(
        f"{p} record {k}{where}: not valid JSON from here on ({type(e).__name__}: {_first_line(e)}); the file is "
        "truncated or corrupt. Re-download or re-export it (NaN and Infinity are not JSON: write null for a "
        "missing label)."
    )


def _looks_like_mptrj_stream(p: Path) -> bool:
    """True when the stream is ``{material_id: {frame_id: {..., "structure": ...}}}``; reads one frame."""
    ijson = _ijson()
    depth = 0
    try:
        with _open_binary(p) as f:
            for _prefix, event, value in ijson.parse(f, use_float=True):
                if event in ("start_map", "start_array"):
                    depth += 1
                    if event == "start_array" and depth <= 3:
                        return False  # the document, a material or a frame is a list
                elif event in ("end_map", "end_array"):
                    depth -= 1
                    if depth <= 2:
                        return False  # the first frame (or material, or document) ended without a structure
                elif event == "map_key":
                    if depth == 3 and value == "structure":
                        return True
                elif depth <= 2:
                    return False  # a scalar where a material or a frame should be
    except _stream_errors() as e:
        raise MatRISInputError(f"{p}: not valid JSON ({type(e).__name__}: {_first_line(e)}); give an MPtrj-style "
                               "or MatPES JSON file, or re-download a truncated one.") from e
    return False


def _json_kind(p: Path) -> str:
    """"matpes" (a list), "mptrj" (the MPtrj dict) or "other" (another JSON dict: an ASE JSON database)."""
    first = _json_first_char(p)
    if first == "[":
        return "matpes"
    if first == "{":
        return "mptrj" if _looks_like_mptrj_stream(p) else "other"
    what = "the file is empty" if not first else f"it starts with {first!r}"
    raise MatRISInputError(f"{p}: not valid JSON ({what}); give an MPtrj JSON ({{...}}), a MatPES JSON list "
                           "([...]) or an ASE JSON database.")


def _system_from_structure_dict(d: dict, who: str, name: str) -> AtomicSystem:
    """An AtomicSystem straight from ``Structure.as_dict()`` (as pymatgen would build it, but fast)."""
    try:
        lattice = np.asarray(d["lattice"]["matrix"], dtype=np.float64)
        pbc = d["lattice"].get("pbc", (True, True, True))
        positions, numbers = [], []
        for s, site in enumerate(d["sites"]):
            species = site["species"]
            if len(species) != 1 or abs(float(species[0].get("occu", 1.0)) - 1.0) > 1e-8:
                raise MatRISInputError(
                    f"{who}: site {s} is disordered (partial occupancies); MatRIS needs one element per site. "
                    "Order the structure first."
                )
            symbol = species[0]["element"]
            if symbol not in _SYMBOL_TO_Z:
                raise MatRISInputError(
                    f"{who}: site {s} has unknown element {symbol!r}; MatRIS needs a chemical element (H to Pu) on "
                    "every site. Fix the structure or remove the record."
                )
            numbers.append(_SYMBOL_TO_Z[symbol])
            positions.append(site["xyz"] if "xyz" in site else np.asarray(site["abc"], dtype=np.float64) @ lattice)
        positions = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    except (KeyError, TypeError, IndexError, ValueError) as e:
        if isinstance(e, MatRISInputError):
            raise
        raise MatRISInputError(
            f"{who}: the 'structure' entry is not a pymatgen Structure.as_dict() ({type(e).__name__}: {e})."
        ) from e
    return AtomicSystem(positions, lattice, pbc, numbers, name)
