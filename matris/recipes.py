"""The published training recipes (``examples/configs/*.yaml``), found by name.

    matris train --config tiny              # a recipe by name (.yaml optional)
    matris train --config my.yaml           # any existing file wins over a name

The recipes live once, in ``examples/configs/`` of the source tree, and install as the package
data ``matris/recipes_data/`` (pyproject.toml maps one onto the other); data paths inside a
recipe are relative to its file, so ``tiny`` trains from an installed wheel in any folder.

Relative paths in any config file are resolved against that file's folder (not the current
folder): a config and its data move together. To change a recipe, copy it with its data
(:func:`copy`, ``matris recipes --copy NAME DIR``); a lone copy of the YAML file would look
for the data beside itself.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .errors import MatRISInputError
from .rerun import overwrite as overwrite_option

SUFFIX = ".yaml"


def folder() -> Path:
    """The folder of the recipes: ``matris/recipes_data`` in an installed wheel,
    ``examples/configs`` in a source checkout (also when installed editable)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "recipes_data", here.parent / "examples" / "configs"):
        if candidate.is_dir():
            return candidate
    raise MatRISInputError(f"no training recipes found (neither {here / 'recipes_data'} nor "
                           f"{here.parent / 'examples' / 'configs'} exists): reinstall matris-mlip")


def available() -> list[tuple[str, str]]:
    """The recipes as (name, description), sorted by name; the description is the first
    sentence of the comment that opens the file."""
    paths = sorted(folder().glob(f"*{SUFFIX}"), key=lambda path: path.stem)
    return [(path.stem, _description(path)) for path in paths]


def names() -> list[str]:
    """The recipe names, sorted."""
    return [name for name, _ in available()]


def find(name_or_path: str | os.PathLike) -> Path:
    """The YAML file of a recipe: a path that exists is returned as is; otherwise a recipe
    name such as ``tiny`` or ``matris-10m-oam`` (``.yaml`` optional). The documented paths
    ``examples/configs/NAME.yaml`` name the recipe too, from a folder without that file.

    Raises :class:`MatRISInputError` (one line, listing the recipes) for anything else."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        raise MatRISInputError(f"{path} is a folder, not a config file: give a YAML file or a recipe name "
                               f"({', '.join(names())})")
    text = str(name_or_path)
    if path.parent.as_posix() == "examples/configs":  # the source tree's path, run from elsewhere
        text = path.name
    name = text[: -len(SUFFIX)] if text.endswith(SUFFIX) else text
    candidate = folder() / f"{name}{SUFFIX}"
    if os.sep not in name and "/" not in name and candidate.is_file():
        return candidate
    raise MatRISInputError(f"no config file {text} and no recipe of that name: give a YAML file or one of "
                           f"the recipes {', '.join(names())} (matris recipes lists them)")


def data_files(path: str | os.PathLike) -> list[Path]:
    """The data files a recipe names by a relative path that exist beside it (what :func:`copy` copies)."""
    from .extras import require

    yaml = require("yaml", "train", "reading a training config")
    path = find(path)
    data = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("data") or {}
    names = [data.get(k) or [] for k in ("train", "val", "test")]
    names += [d.get(k) or [] for d in data.get("datasets") or [] for k in ("train", "val", "test")]
    out: list[Path] = []
    for name in (n for group in names for n in ([group] if isinstance(group, str) else group)):
        file = path.parent / str(name)
        if not Path(name).is_absolute() and ".." not in Path(name).parts and file.is_file() and file not in out:
            out.append(file)
    return out


def copy(name: str, folder: str | os.PathLike = ".", overwrite: bool = False) -> Path:
    """Copy recipe ``name`` and the data files it names into ``folder``, keeping their relative
    paths, so that the copy trains as it is (``matris train --config FOLDER/NAME.yaml``); returns
    the copied YAML file. Existing files are kept unless ``overwrite=True`` (``--overwrite``)."""
    source = find(name)
    folder = Path(folder)
    pairs = [(source, folder / source.name)]
    pairs += [(f, folder / f.relative_to(source.parent)) for f in data_files(source)]
    existing = [str(dst) for _, dst in pairs if dst.exists()]
    if existing and not overwrite:
        one = len(existing) == 1
        raise MatRISInputError(f"{', '.join(existing)} already exist{'s' if one else ''}: pass {overwrite_option()} "
                               f"to replace {'it' if one else 'them'}, or copy into another folder")
    for src, dst in pairs:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp")  # copied, then renamed: never half a file under the real name
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    return pairs[0][1]


def _description(path: Path) -> str:
    """The first sentence of the comment block at the top of a recipe, up to the first colon
    outside parentheses and without a closing parenthesis (the details are for the file's reader)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if not text or line.startswith("#   "):  # a blank comment line or an indented command ends it
            break
        lines.append(text)
    text = " ".join(lines)
    sentence = re.split(r"(?<=[.:])\s+(?=[A-Z])", text, maxsplit=1)[0]
    depth = 0
    for k, char in enumerate(sentence):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ":" and depth == 0:
            sentence = sentence[:k]
            break
    sentence = sentence.rstrip(" .:")
    if sentence.endswith(")") and "(" in sentence:
        sentence = sentence[: sentence.rindex("(")]
    return sentence.rstrip(" ,;")


__all__ = ["available", "copy", "data_files", "find", "folder", "names"]
