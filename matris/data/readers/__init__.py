"""Labelled structures from files: ASE-readable files, ASE databases (sqlite and LMDB), and the
MPtrj and MatPES JSON releases, streamed at constant memory.

Every reader returns :class:`Sample` objects in MatRIS units and conventions:

- energy: TOTAL energy of the structure, eV (float64); NaN when missing.
- forces: ``[n_atoms, 3]`` eV/Å; ``None`` when missing.
- stress: ``[3, 3]`` GPa with the ASE sign convention (positive = tensile, i.e. a cell that
  wants to shrink). ASE's ``atoms.get_stress()`` is eV/Å³ with this sign, so
  GPa = eV/Å³ × 160.21766208. ``None`` when missing.
- magmoms: ``[n_atoms]`` Bohr magnetons μB; ``None`` when missing.

A label that is present must be finite: NaN or infinite energies, forces, stresses or magmoms
are an error (never read as "missing").

Formats, by suffix: ``.extxyz``/``.xyz`` (and anything else ASE reads), ``.traj``, ``.db``
(ASE sqlite), ``.aselmdb``/``.lmdb`` (ASE-LMDB: OMat24, sAlex, OMol25), ``.json``/``.json.gz``
(MPtrj ``{material: {frame: ...}}``, MatPES ``[record, ...]``, else an ASE JSON database).
:func:`iter_samples` reads records ``[start, stop)`` of any of them in file order, touching as
little of the file as the format allows; :func:`count_samples` counts cheaply where possible;
:func:`expand_data_paths` turns files, directories and globs into one list of data files.

Errors: a problem the user can fix raises :class:`~matris.errors.MatRISInputError` naming the
file, the record (index in file order, counting from 0, and its id where the format has one),
the problem and the fix. With ``on_error="skip"`` a bad record is yielded as a
:class:`BadRecord` instead and reading goes on with the next record (a truncated or corrupt
stream yields one BadRecord and ends).

ase, ijson and ase-db-backends are imported inside the readers, so ``matris.data`` imports
without them; ijson (JSON) and ase-db-backends (ASE-LMDB) come with the ``data`` extra, and a
reader that needs a missing one says so in one line (:func:`matris.extras.require`).

Modules, one per format: :mod:`.ase_files` (anything ``ase.io`` reads), :mod:`.extxyz`
(extxyz by byte offsets), :mod:`.ase_db` (ASE sqlite and ASE-LMDB databases),
:mod:`.mptrj` and :mod:`.matpes` (the JSON releases, on :mod:`.json_streams`); what they
share (units, checks, label extraction, building a :class:`Sample`) is in :mod:`.common`,
and :mod:`.dispatch` picks the reader of a file.
"""

# the private names re-exported (x as x) are imported from here by the tests
from .ase_db import _connect_lmdb as _connect_lmdb
from .ase_db import iter_ase_db, iter_ase_lmdb, read_ase_db, read_ase_lmdb
from .ase_files import iter_ase, read_ase
from .common import EV_PER_A3_TO_GPA, KBAR_TO_GPA, STRESS_UNITS, BadRecord, Sample
from .dispatch import DATA_SUFFIXES, count_samples, expand_data_paths, iter_samples, read_samples
from .json_streams import _ijson as _ijson
from .json_streams import _json_kind as _json_kind
from .matpes import iter_matpes, read_matpes
from .mptrj import iter_mptrj, read_mptrj

__all__ = [
    "Sample",
    "BadRecord",
    "read_ase",
    "iter_ase",
    "read_ase_db",
    "iter_ase_db",
    "read_ase_lmdb",
    "iter_ase_lmdb",
    "read_mptrj",
    "iter_mptrj",
    "read_matpes",
    "iter_matpes",
    "iter_samples",
    "count_samples",
    "read_samples",
    "expand_data_paths",
    "DATA_SUFFIXES",
    "EV_PER_A3_TO_GPA",
    "KBAR_TO_GPA",
    "STRESS_UNITS",
]
