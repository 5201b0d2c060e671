"""Reading structure files, with an error a user can act on for every bad file.

The one reader behind ``matris predict``, ``relax``, ``md``, ``eos``, ``phonons``, ``bench
--structures`` and ``discovery --structures``: ASE first (any format it knows), pymatgen
for what ASE cannot read. Unreadable, empty, binary, truncated or wrong-format files raise
:class:`MatRISInputError` in one line naming the file, the format tried, the problem and
what to do, never a traceback or a parser's warning from deep inside a parser.

:func:`check_file` does the checks that need no parser (exists, is a file, not empty) and
imports nothing heavy, so the command line can check every input before it imports ASE or
torch.

Partially occupied sites (a CIF site holding Fe 0.5 and Ni 0.5, or Li 0.5 and a vacancy) are an
error by default: ASE's CIF reader keeps only the majority species of each site, and pymatgen
gives a disordered Structure, and either way the model would evaluate a structure that is not
the one in the file. ``majority_species=True`` (``--majority-species`` on the command line)
accepts ASE's reading knowingly.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from .errors import MatRISInputError, MatRISInputWarning, counted

# Containers that are binary by design and that ASE or pymatgen read (ASE's own binary formats
# are found by name in its format table): sniffing them for text makes no sense.
BINARY_SUFFIXES = (".traj", ".db", ".nc", ".gz", ".bz2", ".xz", ".zip", ".lmdb", ".aselmdb", ".h5", ".hdf5")
FIX = ("give a structure file that ASE or pymatgen reads (CIF, POSCAR/CONTCAR, extxyz, ASE .traj, ...), with an "
       "extension that names its format")
_SYMBOL_LIKE = re.compile(r"^[A-Za-z][a-z]{0,2}\d*[+-]?$")
OCCUPANCY_TOLERANCE = 0.01  # a site whose species fill it to within 1 % is full (CIFs round to 0.99..1)
ORDER_FIX = ("order it first: pick one species per site yourself (e.g. pymatgen's "
             "OrderDisorderedStructureTransformation on a supercell, or a special quasirandom structure (SQS)), or "
             "accept ASE's reading that puts each site's majority species on it, knowingly, with --majority-species "
             "(Python: read_frames(path, majority_species=True))")


def check_file(path: str | os.PathLike, what: str = "structure file") -> Path:
    """``path`` if it is a non-empty, readable file; else ``FileNotFoundError`` (missing) or
    :class:`MatRISInputError` (a folder, empty, unreadable), each naming the fix. Cheap: no
    parser is imported."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {what} {path}; check the path ({FIX})")
    if path.is_dir():
        raise MatRISInputError(f"{path} is a folder, not a {what}; give the structure files in it")
    try:
        size = path.stat().st_size
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise MatRISInputError(f"cannot read {path} ({exc.strerror}); check its permissions") from None
    if size == 0:
        raise MatRISInputError(f"{path} is empty (0 bytes); {FIX}")
    return path


def format_name(path: Path) -> str | None:
    """The ASE format ``path`` would be read as (from its name or first bytes), or ``None``
    when ASE knows no format for it."""
    try:
        from ase.io.formats import filetype, ioformats

        name = str(filetype(str(path), guess=True))
        if name == "vasp":
            # ASE reads any name that starts with POSCAR/CONTCAR as VASP, so our own outputs
            # (POSCAR.relaxed.extxyz, POSCAR.final.extxyz) would not read back: a suffix that names
            # another format wins
            name = _suffix_format(path) or name
        return name if name in ioformats else None
    except Exception:  # noqa: BLE001 - only a label for the message
        return None


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")  # the compressions ASE reads transparently


def uncompressed_name(path: str | os.PathLike) -> str:
    """``path``'s file name without a compression suffix (``mp-149.cif.gz`` → ``mp-149.cif``)."""
    name = Path(path).name
    for suffix in COMPRESSED_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _suffix_format(path: Path) -> str | None:
    """The ASE format that ``path``'s suffix names (``.extxyz`` → extxyz), compression aside."""
    from ase.io.formats import extension2format, ioformats

    ext = Path(uncompressed_name(path).lower()).suffix[1:]
    if not ext:
        return None
    if ext in ioformats:
        return ext
    return extension2format[ext].name if ext in extension2format else None


def _is_binary_format(path: Path, fmt: str | None) -> bool:
    """Whether the format a file is read as is binary by design (so binary content is fine)."""
    if path.name.lower().endswith(BINARY_SUFFIXES):
        return True
    if fmt is None:
        return False
    from ase.io.formats import ioformats

    # cif is flagged binary in ASE's table only because it is opened in bytes mode
    return fmt != "cif" and ioformats[fmt].isbinary


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(8192)
    if b"\0" in head:
        return True
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > max(3, len(text) // 100)  # more than a stray byte: not text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def read_frames(path: str | os.PathLike, index: str = ":", majority_species: bool = False) -> list:
    """The frames ``index`` (an ASE index string: ``":"`` all, ``"-1"`` the last) of ``path``
    as ASE Atoms, each with at least one atom. Raises ``FileNotFoundError`` for a missing
    file and :class:`MatRISInputError` for any file that is not a readable structure, and for
    one with partially occupied sites (naming the site and its occupancies) unless
    ``majority_species``: then each such site holds its majority species, as ASE reads it, and
    one :class:`~matris.errors.MatRISInputWarning` says how many sites that changed."""
    frames = _read(path, index)
    for k, atoms in enumerate(frames):
        _check_occupancies(atoms, Path(path), k, len(frames), majority_species)
    return frames


def _read(path: str | os.PathLike, index: str) -> list:
    path = check_file(path)
    fmt = format_name(path)
    label = fmt or "none"
    if not _is_binary_format(path, fmt) and _looks_binary(path):
        if fmt is None:
            raise MatRISInputError(
                f"{path} holds binary data, and its name ({_suffix(path)}) names no structure format ASE or "
                f"pymatgen reads (format tried: none); {FIX}")
        raise MatRISInputError(f"{path} holds binary data, not a {fmt} text file (format tried: {fmt}); {FIX}")
    if fmt is None:
        frames = _read_with_pymatgen(path)
        if frames is None:
            raise MatRISInputError(
                f"{path}: neither ASE nor pymatgen knows a structure format for its name ({_suffix(path)}) or its "
                f"contents (format tried: none); {FIX}")
        return _checked(frames, path, index, "pymatgen")
    from ase.io import read

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # parsers warn about what they then fail on: the error says it
            frames = read(path, index=index, format=fmt)
    except Exception as ase_exc:  # noqa: BLE001 - ASE raises many kinds for bad files: try pymatgen, then report
        frames = _read_with_pymatgen(path)
        if frames is None:
            raise MatRISInputError(_diagnose(path, fmt, ase_exc)) from None
    return _checked(frames, path, index, label)


def partial_sites(atoms) -> list[tuple[int, str, str]]:
    """The partially occupied sites of ASE ``atoms`` as ASE's CIF reader records them
    (``atoms.info["occupancy"]``: species → occupancy per site kind, the kind of each atom in
    ``atoms.arrays["spacegroup_kinds"]``): ``(atom index, kind, "Fe 0.5 + Ni 0.5")`` for each
    atom whose site holds more than one species or is less than full (the rest a vacancy)."""
    occupancy = atoms.info.get("occupancy")
    if not isinstance(occupancy, dict) or not occupancy:
        return []
    kinds = atoms.arrays.get("spacegroup_kinds")
    kinds = range(len(atoms)) if kinds is None else kinds
    sites, seen = [], {}
    for index, kind in enumerate(kinds):
        key = str(int(kind))
        if key not in seen:
            seen[key] = _partial(occupancy.get(key) or occupancy.get(int(kind)))
        if seen[key] is not None:
            sites.append((index, key, seen[key]))
    return sites


def _partial(species: dict | None) -> str | None:
    """``"Fe 0.5 + Ni 0.5"`` (``"Li 0.5 + vacancy 0.5"``) for a partially occupied site, else None."""
    if not isinstance(species, dict):
        return None
    try:
        shares = {str(k): float(v) for k, v in species.items() if float(v) > 0}
    except (TypeError, ValueError):
        return None
    total = sum(shares.values())
    if len(shares) <= 1 and total >= 1 - OCCUPANCY_TOLERANCE:
        return None
    parts = [f"{name} {share:g}" for name, share in sorted(shares.items(), key=lambda kv: -kv[1])]
    if total < 1 - OCCUPANCY_TOLERANCE:
        parts.append(f"vacancy {1 - total:.4g}")
    return " + ".join(parts)


def _site_labels(path: Path, frame: int, frames: int) -> list[str] | None:
    """The ``_atom_site_label`` column of the CIF block of frame ``frame``, where it is clear
    which block that is (one block, or one per frame); else None. Only for the error message."""
    try:
        from ase.io.cif import parse_cif

        blocks = [b for b in parse_cif(str(path)) if b.has_structure()]
        block = blocks[0] if len(blocks) == 1 else blocks[frame] if len(blocks) == frames else None
        labels = None if block is None else block.get("_atom_site_label")
        return [str(label) for label in labels] if labels is not None else None
    except Exception:  # noqa: BLE001 - a label is a courtesy: the message holds without it
        return None


def _check_occupancies(atoms, path: Path, frame: int, frames: int, majority_species: bool) -> None:
    sites = partial_sites(atoms)
    if not sites:
        return
    index, kind, text = sites[0]
    where = f"{path}" + (f" (frame {frame})" if frames > 1 else "")
    if majority_species:
        warnings.warn(
            f"{where}: {len(sites)} of {len(atoms)} atoms sit on partially occupied sites (e.g. atom {index}: "
            f"{text}); --majority-species: each holds its majority species, as ASE reads it", MatRISInputWarning,
            stacklevel=3)
        atoms.info.pop("occupancy", None)  # now a deliberate ordered structure: no warning later
        return
    labels = _site_labels(path, frame, frames) if path.suffix.lower() == ".cif" else None
    label = f" (CIF site {labels[int(kind)]})" if labels is not None and int(kind) < len(labels) else ""
    raise MatRISInputError(
        f"{where} has partial occupancies: atom {index}{label} is {text} (ASE's reading keeps only "
        f"{atoms[index].symbol}), and {len(sites)} of {len(atoms)} atoms sit on such sites; MatRIS needs one "
        f"element per site: {ORDER_FIX}")


def _checked(frames, path: Path, index: str, fmt: str) -> list:
    frames = frames if isinstance(frames, list) else [frames]
    if not frames:
        raise MatRISInputError(f"{path}: index {index!r} selects no frame (format {fmt}); check the file and the index")
    for k, atoms in enumerate(frames):
        if len(atoms) == 0:
            raise MatRISInputError(f"{path}: frame {k} has no atoms (format {fmt}); the file may be truncated: {FIX}")
    return frames


def _suffix(path: Path) -> str:
    return f"'{path.suffix}'" if path.suffix else "no extension"


def _diagnose(path: Path, fmt: str, exc: BaseException) -> str:
    """One line for a file ASE (and pymatgen) could not parse: the specific problem where it
    can be found (an unknown element symbol, a truncated POSCAR), else the parser's words."""
    symbol = _unknown_symbol(exc)
    if symbol is not None:
        where = _line_of(path, symbol)
        return (f"{path} is not a valid {fmt} file (format tried: {fmt}): {symbol!r} is not a chemical element "
                f"symbol{where}; give every site an element symbol from H to Pu (e.g. Si, O, Fe)")
    if fmt == "vasp":
        problem = vasp_problem(path)
        if problem is not None:
            return (f"{path} is not a valid VASP POSCAR file (format tried: vasp): {problem}; complete or correct "
                    "the file (or write it again with ASE, pymatgen or VASP)")
    return (f"{path} is not a valid {fmt} file (format tried: {fmt}; {_first_line(exc)}); it may be truncated or in "
            f"another format: {FIX}")


def _unknown_symbol(exc: BaseException) -> str | None:
    """The symbol of ``KeyError('Xx')``, as ASE raises for an element it does not know."""
    if not isinstance(exc, KeyError) or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return None
    symbol = exc.args[0]
    if not _SYMBOL_LIKE.match(symbol):
        return None
    from ase.data import atomic_numbers

    return None if symbol in atomic_numbers else symbol


def _line_of(path: Path, token: str) -> str:
    """`` (line N: '...')`` for the first line holding ``token`` as a word, else ``""``."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                if re.search(rf"(?<![A-Za-z]){re.escape(token)}(?![a-z])", line):
                    return f" (line {number}: {line.strip()[:60]!r})"
    except OSError:
        pass
    return ""


def vasp_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with a POSCAR/CONTCAR file, as a phrase naming the line, or ``None`` if
    its layout looks complete (comment, scale, 3 lattice vectors, [species], counts,
    [Selective dynamics], Direct/Cartesian, one position line of 3 numbers per atom)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None

    def numbers(k: int) -> list[float] | None:
        try:
            return [float(x) for x in lines[k].split()]
        except ValueError:
            return None

    if len(lines) < 2 or not numbers(1):
        return "line 2 must be the scale factor (a number)" if len(lines) >= 2 else "it ends after line 1"
    for k in (2, 3, 4):
        if k >= len(lines):
            return f"it ends after line {len(lines)}, before the three lattice vectors (lines 3-5) are complete"
        row = numbers(k)
        if row is None or len(row) < 3:
            return f"line {k + 1} must be a lattice vector of 3 numbers, found {lines[k].strip()[:40]!r}"
    k = 5
    if k >= len(lines):
        return "it ends after the lattice vectors, before the element names and atom counts"
    counts_line = k if _all_ints(lines[k]) else k + 1
    if counts_line >= len(lines) or not _all_ints(lines[counts_line]):
        return f"line {counts_line + 1} must be the number of atoms of each element (whole numbers)"
    counts = [int(x) for x in lines[counts_line].split()]
    if counts_line == 6 and len(lines[5].split()) != len(counts):
        return (f"line 6 names {counted(len(lines[5].split()), 'element')} but line 7 gives "
                f"{counted(len(counts), 'count')}; "
                "give one count per element")
    k = counts_line + 1
    if k < len(lines) and lines[k].strip()[:1] in ("s", "S"):
        k += 1  # Selective dynamics
    if k >= len(lines) or lines[k].strip()[:1] not in ("d", "D", "c", "C", "k", "K"):
        return f"line {k + 1} must say Direct or Cartesian" if k < len(lines) else \
            f"it ends after line {len(lines)}, before the Direct/Cartesian line and the positions"
    natoms, first = sum(counts), k + 1
    for atom in range(natoms):
        line = first + atom
        if line >= len(lines) or not lines[line].split():
            return (f"it is truncated: line {counts_line + 1} declares {natoms} atoms but the positions end after "
                    f"{atom} (line {min(line, len(lines))})")
        words = lines[line].split()[:3]  # selective-dynamics flags (T F T) and labels may follow
        if len(words) < 3:
            return (f"it is truncated: line {line + 1}, the position of atom {atom + 1} of {natoms}, has "
                    f"{counted(len(words), 'number')} instead of 3")
        if not all(_is_number(w) for w in words):
            return f"line {line + 1}, the position of atom {atom + 1} of {natoms}, is not 3 numbers"
    return None


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _all_ints(line: str) -> bool:
    parts = line.split()
    return bool(parts) and all(p.isdigit() for p in parts)


def _read_with_pymatgen(path: Path):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its CIF parser warns with source lines: the error says what failed
            from pymatgen.core import Structure
            from pymatgen.io.ase import AseAtomsAdaptor

            structure = Structure.from_file(path)
            if not structure.is_ordered:
                return [_disordered_atoms(structure)]
            return [AseAtomsAdaptor.get_atoms(structure)]
    except Exception:  # noqa: BLE001 - the ASE error is the one reported
        return None


def _disordered_atoms(structure):
    """ASE Atoms of a disordered pymatgen Structure as ASE's CIF reader gives them: each
    site's majority species, with ``info["occupancy"]`` per site, so the one check above
    reports (or, with ``majority_species``, accepts) it."""
    from ase import Atoms

    occupancy, symbols = {}, []
    for k, site in enumerate(structure):
        shares = {el.symbol: float(x) for el, x in site.species.items()}
        occupancy[str(k)] = shares
        symbols.append(max(shares, key=shares.get))
    atoms = Atoms(symbols=symbols, positions=structure.cart_coords, cell=structure.lattice.matrix, pbc=True)
    atoms.info["occupancy"] = occupancy
    return atoms


__all__ = ["read_frames", "check_file", "format_name", "vasp_problem", "partial_sites"]
