#!/usr/bin/env bash
# The package as a user gets it: build the wheel, install it (not editable, the core only) into a
# fresh virtual environment, and use it from a folder outside the checkout: the CLI, the
# calculator, a relaxation, a recipe by name; the training stack must not be there.
#
#   bash .ci/wheel_smoke.sh            # prints the core's package count and size at the end
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"   # nothing below may import from the checkout

python3 -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
MATRIS="$WORK/venv/bin/matris"
pip() {  # pip's exit status; without the notes about configured index folders this machine lacks
    { "$PY" -m pip "$@" 2>&1; } | { grep -v "^WARNING: Location .* is ignored" || true; }
}
# CPU torch first (this machine's local wheel), so nothing pulls a multi-GB CUDA build
pip install -q torch==2.13.0
# the wheel, built as pip builds it for users (an isolated build with setuptools from the index),
# from a copy of the files git would commit: no build/ or stale egg-info in the checkout, none used
SRC="$ROOT"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    SRC="$WORK/src"
    mkdir "$SRC"
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
        (cd "$ROOT" && while IFS= read -r -d '' f; do [ -e "$f" ] && cp --parents -- "$f" "$SRC"; done; true)
fi
pip wheel -q --no-deps -w "$WORK/dist" "$SRC"
pip install -q "$WORK"/dist/matris_mlip-*.whl

echo "== matris --version"
"$MATRIS" --version
echo "== matris predict (the bundled demo model and example)"
"$MATRIS" predict
echo "== the calculator and a relaxation"
"$PY" - <<'PY'
import warnings

import matris
from ase.build import bulk
from matris import MatRISCalculator
from matris.simulate import relax

assert "site-packages" in matris.__file__, matris.__file__  # the installed wheel, not the checkout
warnings.simplefilter("ignore")  # the demo-model notice
atoms = bulk("Si", "diamond", a=5.43, cubic=True)
atoms.rattle(0.05, seed=0)
atoms.calc = MatRISCalculator()
energy = atoms.get_potential_energy()
result = relax(atoms, steps=5)
assert result.energy <= energy + 1e-4, (energy, result.energy)
print(f"Si8: {energy:.4f} eV, relaxed in {result.steps} steps to {result.energy:.4f} eV")
PY
echo "== a recipe by name"
"$PY" -c "import matris.recipes as r; p = r.find('tiny'); assert p.is_file() and 'site-packages' in str(p), p; print(p)"
echo "== the core is light"
if "$PY" -c "import lightning" 2>/dev/null; then echo "lightning is installed with the core"; exit 1; fi
if "$MATRIS" train --config tiny >"$WORK/train.log" 2>&1; then echo "matris train ran without the train extra"; exit 1; fi
grep -q "matris-mlip\[train\]" "$WORK/train.log" || { cat "$WORK/train.log"; echo "no hint to install the train extra"; exit 1; }
tail -1 "$WORK/train.log"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "core install: $(pip list | tail -n +3 | wc -l) packages, $(du -sh "$SITE" | cut -f1) in site-packages"
echo "wheel smoke test passed"
