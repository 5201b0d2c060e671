"""The package's modules import one another without cycles (issue 47): read from the source, every
import counted, the lazy ones inside functions too (a lazy import that only breaks a cycle is still
the cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_files() -> dict[str, Path]:
    """``{dotted name: file}`` of ``matris`` and of ``kernels/`` (installed as ``matris.kernels``)."""
    out = {}
    for top, name in ((ROOT / "matris", "matris"), (ROOT / "kernels", "matris.kernels")):
        for path in top.rglob("*.py"):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` (at ``path``) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = ".".join(p for p in (base if node.level else "", node.module or "") if p)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            # the deepest known module the name refers to (`from .x import f` is the module x)
            while target and target not in known:
                target = target.rpartition(".")[0]
            # importing a module runs its packages' __init__ first: edges to those too, except to the
            # packages enclosing ``name`` (their code always runs before their submodules')
            while target:
                if target != name and not name.startswith(target + "."):
                    found.add(target)
                target = target.rpartition(".")[0]
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


KNOWN: list[list[str]] = []  # no cycle (matris.pretrained verifies by the check the model passes it)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == KNOWN, "import cycles (each line one cycle's modules):\n" + "\n".join(" ".join(c) for c in found)
