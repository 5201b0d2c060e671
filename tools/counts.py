"""The counts the codebase is held to (issue #61), measured on the checkout; ``--check`` fails when
one is over its limit.

    python tools/counts.py            # the table
    python tools/counts.py --check    # exit 1 when a count is over its limit (CI)
    python tools/counts.py --json F   # also write the counts to F

- kernel selection: places in ``matris/model``, ``kernels`` and ``matris/domain`` that choose or
  switch kernels: calls of ``choose(...)`` and ``references(...)``, and comparisons of a kernel
  choice (``kernels == ...``, or anything compared with a kernel's name: ``== "torch"``,
  ``in ("fused", "triton")``), found in the syntax tree (comments and docstrings do not count);
- lines: physical lines of the Python files there;
- files from the calculator to the Φ kernel: the distinct files of the package on the call stack at
  the moment ``matris.kernels.gated_phi`` is entered from ``MatRISCalculator.calculate`` (a tiny
  model's energy, forces and stress, traced);
- the longest file in ``matris/`` (and ``kernels/``);
- absolute machine paths (``/work/``, ``/root/``, ``/home/``) in tracked files, committed result
  logs and JSON (``benchmarks/results``) excepted: they record where they ran.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = [ROOT / "matris" / "model", ROOT / "kernels", ROOT / "matris" / "domain"]
LIMITS = {"kernel_selection": 8, "core_lines": 4600, "files_calculator_to_phi": 5, "longest_file_lines": 700,
          "machine_paths": 0}
CHOICE_NAMES = {"kernels", "block_kernels"}
KERNEL_NAMES = {"triton", "fused", "torch", "auto"}


def _name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _names_kernels(node: ast.Compare) -> bool:
    """Whether a comparison tests against a kernel choice's name (``x == "torch"``, ``x in ("fused", ...)``)."""
    for part in [node.left, *node.comparators]:
        values = part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
        if any(isinstance(v, ast.Constant) and v.value in KERNEL_NAMES for v in values):
            return True
    return False


def selection_sites(path: Path) -> list[int]:
    """Line numbers of the kernel choices in ``path`` (see the module docstring)."""
    sites = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and _name(node.func) in ("choose", "references"):
            sites.append(node.lineno)
        elif isinstance(node, ast.Compare) and (_name(node.left) in CHOICE_NAMES or _names_kernels(node)):
            sites.append(node.lineno)
    return sorted(set(sites))


def core_files() -> list[Path]:
    return sorted(p for d in CORE for p in d.rglob("*.py"))


def calculator_to_phi() -> list[str]:
    """The package's files on the stack when the Φ operator is entered from the calculator."""
    code = r'''
import sys, json, torch
from ase.build import bulk
from matris import MatRIS, MatRISCalculator, MatRISConfig
import matris.kernels.phi as phi
torch.manual_seed(0)
model = MatRIS(MatRISConfig(num_layers=2, node_feat_dim=16, edge_feat_dim=16, three_body_feat_dim=16,
                            mlp_hidden_dims=(16,))).eval()
atoms = bulk("Si", "diamond", a=5.43)
atoms.calc = MatRISCalculator(model)
seen = []
target = phi.gated_phi.__code__
def profile(frame, event, arg):
    if event == "call" and frame.f_code is target and not seen:
        f, stack = frame, []
        while f is not None:
            stack.append(f.f_code.co_filename)
            if f.f_code.co_name == "calculate" and f.f_code.co_filename.endswith("calculator.py"):
                seen.append(stack)
                break
            f = f.f_back
sys.setprofile(profile)
atoms.get_stress()
sys.setprofile(None)
print(json.dumps(seen[0] if seen else []))
'''
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    stack = json.loads(out.stdout.strip().splitlines()[-1])
    files = []
    for f in reversed(stack):
        p = Path(f).resolve()
        for base in (ROOT / "matris", ROOT / "kernels"):
            if p.is_relative_to(base):
                rel = str(p.relative_to(ROOT))
                if rel not in files:
                    files.append(rel)
    return files


def machine_paths() -> list[str]:
    out = subprocess.run(["git", "grep", "-nE", "/work/|/root/|/home/", "--", ".", ":!benchmarks/results",
                          ":!tools/counts.py"], cwd=ROOT, capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line]


def counts() -> dict:
    sites = {str(p.relative_to(ROOT)): selection_sites(p) for p in core_files()}
    sites = {k: v for k, v in sites.items() if v}
    package = sorted((ROOT / "matris").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    longest = max(package, key=lambda p: len(p.read_text().splitlines()))
    path = calculator_to_phi()
    found = machine_paths()
    return {
        "kernel_selection": sum(len(v) for v in sites.values()),
        "kernel_selection_sites": sites,
        "core_lines": sum(len(p.read_text().splitlines()) for p in core_files()),
        "files_calculator_to_phi": len(path),
        "calculator_to_phi": path,
        "longest_file_lines": len(longest.read_text().splitlines()),
        "longest_file": str(longest.relative_to(ROOT)),
        "machine_paths": len(found),
        "machine_path_lines": found[:20],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when a count is over its limit")
    p.add_argument("--json", help="also write the counts to this JSON file")
    args = p.parse_args(argv)
    c = counts()
    over = []
    print(f"{'count':28s} {'value':>7s} {'limit':>7s}")
    for key, limit in LIMITS.items():
        flag = "" if c[key] <= limit else "  OVER"
        if flag:
            over.append(key)
        print(f"{key:28s} {c[key]:7d} {limit:7d}{flag}")
    print(f"  kernel selection: {c['kernel_selection_sites']}")
    print(f"  calculator to phi: {' -> '.join(c['calculator_to_phi'])}")
    print(f"  longest file: {c['longest_file']}")
    for line in c["machine_path_lines"]:
        print(f"  machine path: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({"limits": LIMITS, **c}, indent=1) + "\n")
    return 1 if (args.check and over) else 0


if __name__ == "__main__":
    sys.exit(main())
