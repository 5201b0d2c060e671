"""The documentation site: it builds with warnings as errors, its runnable examples run, and
the README stays a landing page whose links resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MARKER = "<!-- runnable -->"
# run with the bundled model in place of the published ones, which cannot be downloaded offline
MARKER_DEMO = "<!-- runnable with matris-demo -->"
FRAGMENT = re.compile(r"^<!--\s*fragment:\s*(\S.*?)\s*-->$")
# blocks that are read, not run: outputs, command synopses, input scripts, citations
UNMARKED_LANGUAGES = {"text", "bibtex"}
PUBLISHED = re.compile(r"\bmatris[-_](?:10m|4m)[\w-]*")


def code_blocks(page: Path) -> list[tuple[str, str, int, str]]:
    """``(language, code, line, marker)`` of every fenced block of a page; ``marker`` is the
    nonblank line before the block (an HTML comment for marked blocks)."""
    lines = page.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            language = stripped[3:].strip()
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            marker = lines[j].strip() if j >= 0 else ""
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            assert end < len(lines), f"{page.name}:{i + 1}: a code block that is never closed"
            indent = len(lines[i]) - len(lines[i].lstrip())
            code = "\n".join(line[indent:] for line in lines[i + 1:end])
            blocks.append((language, code, i + 1, marker))
            i = end
        i += 1
    return blocks


def runnable_blocks(page: Path) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of every block marked runnable, in page order; a block marked
    to run with the bundled model gets it in place of every published model it names."""
    blocks = code_blocks(page)
    out = []
    for language, code, line, marker in blocks:
        if marker == MARKER:
            out.append((language, code, line))
        elif marker == MARKER_DEMO:
            out.append((language, PUBLISHED.sub("matris-demo", code), line))
    markers = [i + 1 for i, text in enumerate(page.read_text().split("\n")) if text.strip() in (MARKER, MARKER_DEMO)]
    assert len(markers) == len(out), (
        f"{page.name}: {len(markers)} runnable markers but {len(out)} marked blocks: a marker must be "
        "followed by a fenced code block")
    return out


# the pages users read (the API pages are generated from docstrings) and the README
USER_PAGES = sorted(p for p in DOCS.rglob("*.md") if p.parent.name != "api") + [README]
PAGES_WITH_EXAMPLES = [p for p in USER_PAGES if runnable_blocks(p)]


def _where(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


@pytest.mark.parametrize("page", USER_PAGES, ids=_where)
def test_every_code_block_runs_or_says_what_it_needs(page):
    """Every code block is run by the docs test, or marked as a fragment that names what it
    needs (a GPU, a download, files of your own); the kinds that are only read (text, bibtex)
    need no marker."""
    for language, code, line, marker in code_blocks(page):
        where = f"{_where(page)}:{line}"
        assert language, f"{where}: give the code block a language (python, bash, text, ...)"
        if marker in (MARKER, MARKER_DEMO):
            assert language in ("python", "bash"), f"{where}: only python and bash blocks can run"
            continue
        fragment = FRAGMENT.match(marker)
        if fragment:
            assert len(fragment.group(1)) >= 5, f"{where}: say what the fragment needs"
            continue
        assert language in UNMARKED_LANGUAGES, (
            f"{where}: a {language} block must run in the docs test ({MARKER} or {MARKER_DEMO} on the line "
            "before it) or be marked as a fragment with what it needs (<!-- fragment: WHAT IT NEEDS -->)")


def test_code_block_markers_are_checked():
    """The marker check itself: a bare block fails, marked ones pass, published names become
    the bundled model in a block marked to run with it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.md"
        page.write_text("x\n\n```python\nprint(1)\n```\n")
        with pytest.raises(AssertionError, match="must run in the docs test"):
            test_every_code_block_runs_or_says_what_it_needs(page)
        page.write_text("<!-- fragment: a GPU -->\n```bash\nnvidia-smi\n```\n\n"
                        "<!-- runnable with matris-demo -->\n```python\nload('matris-10m-oam', 'matris_4m_x')\n```\n")
        test_every_code_block_runs_or_says_what_it_needs(page)
        assert runnable_blocks(page) == [("python", "load('matris-demo', 'matris-demo')", 7)]


def test_some_pages_have_runnable_examples():
    names = {p.name for p in PAGES_WITH_EXAMPLES}
    assert {"quickstart.md", "finetune-tutorial.md", "calculator.md", "simulations.md", "index.md",
            "README.md"} <= names


def run_blocks(blocks: list[tuple[str, str, str]], cwd: Path, env: dict, timeout: float = 600):
    """Run each block in a fresh process (Python in its own interpreter, bash in its own shell),
    in page order in ``cwd``: a block sees no variable, import or setting of the blocks before
    it, only the files they wrote (a tutorial's run folder), as a reader who pastes it into a new
    session. Returns ``(where, completed process)`` of the first block that fails, else None."""
    for language, code, where in blocks:
        if language == "python":
            command = [sys.executable, "-c", code]
        elif language == "bash":
            command = ["bash", "-euo", "pipefail", "-c", code]
        else:
            raise ValueError(f"{where}: cannot run a {language!r} block")
        proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            return where, proc
    return None


def test_each_block_runs_in_a_fresh_process(tmp_path):
    """The runner itself: a block that leans on an earlier block's variables or imports fails;
    files an earlier block wrote are there."""
    env = dict(os.environ)
    assert run_blocks([("python", "x = 1", "a"), ("python", "print(x)", "b")], tmp_path, env)[0] == "b"
    assert run_blocks([("python", "import json", "a"), ("python", "json.dumps(1)", "b")], tmp_path, env)[0] == "b"
    assert run_blocks([("python", "open('f.txt', 'w').write('1')", "a"), ("bash", "cat f.txt", "b"),
                       ("python", "assert open('f.txt').read() == '1'", "c")], tmp_path, env) is None


# --------------------------------------------------------------------- what the core install holds
def _distribution(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: set[str], extra: str = "") -> set[str]:
    """``roots`` and the distributions they require, transitively, as installed here (markers
    evaluated for ``extra`` on the roots, for no extra below them)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen, todo = set(roots), [(name, extra) for name in roots]
    while todo:
        name, wanted = todo.pop()
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": wanted}):
                continue  # an extra not asked for, or another platform
            dist = _canonical(req.name)
            if dist not in seen:
                seen.add(dist)
                todo.append((dist, ""))
    return seen


def core_distributions(transitive: bool = False) -> set[str]:
    """The distributions ``pip install matris-mlip`` installs: the core dependencies (and, with
    ``transitive``, theirs, as installed here), read from the installed package's metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement

    if transitive:
        return _closure({"matris-mlip"})
    core = {"matris-mlip"}
    for text in metadata.requires("matris-mlip") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            core.add(_canonical(req.name))
    return core


def extra_distributions() -> set[str]:
    """The distributions that only matris-mlip's extras bring (with what they require): what a
    core install lacks. (Not everything else installed here: a fresh venv has pip and setuptools,
    which torch's C++ extension builder imports, with whatever they import.)"""
    from importlib import metadata

    extras = set(metadata.metadata("matris-mlip").get_all("Provides-Extra") or [])
    added = set().union(*(_closure({"matris-mlip"}, extra) for extra in extras)) if extras else set()
    return added - _closure({"matris-mlip", "pip", "setuptools", "wheel"})


def imported_modules(code: str) -> set[str]:
    """The top-level modules a Python block imports."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def extra_modules(code: str, core: set[str]) -> dict[str, set[str]]:
    """``{module: its distributions}`` of every module the block imports that neither the
    standard library nor the core distributions provide."""
    from importlib import metadata

    where = metadata.packages_distributions()
    out = {}
    for module in imported_modules(code):
        if module in sys.stdlib_module_names:
            continue
        dists = {_canonical(d) for d in where.get(module, [module])}
        if not dists & core:
            out[module] = dists
    return out


def says_what_it_needs(code: str, dists: set[str]) -> bool:
    """Whether a block names, in a ``pip install`` line, one of ``dists`` or an extra of
    matris-mlip that brings one of them."""
    from importlib import metadata

    extras = {}
    for text in metadata.requires("matris-mlip") or []:
        match = re.search(r'extra == "([\w-]+)"', text)
        if match:
            extras.setdefault(match.group(1), set()).add(_canonical(_distribution(text)))
    for line in code.splitlines():
        if "pip install" not in line:
            continue
        named = {_canonical(w) for w in re.findall(r"[\w.-]+", line.split("pip install", 1)[1])}
        named |= {d for extra in re.findall(r"matris-mlip\[([\w,-]+)\]", line)
                  for e in extra.split(",") for d in extras.get(e, ())}
        if named & dists:
            return True
    return False


def test_readme_python_needs_only_the_core_or_says_its_extra():
    """Every Python block of the README runs on ``pip install matris-mlip`` alone, or says in a
    comment which ``pip install`` it needs; the README's install line is the core."""
    core = core_distributions()
    assert {"torch", "ase", "numpy", "matris-mlip"} <= core and "pymatgen" not in core
    blocks = [(code, line) for language, code, line in runnable_blocks(README) if language == "python"]
    assert blocks and any(not extra_modules(code, core) for code, _ in blocks), \
        "the README should show a Python block that the core install runs"
    for code, line in blocks:
        for module, dists in extra_modules(code, core).items():
            assert says_what_it_needs(code, dists), (
                f"README.md:{line}: imports {module}, which `pip install matris-mlip` does not install; "
                f"say so in the block (# needs {module}: pip install {sorted(dists)[0]})")
    # the check itself
    assert not says_what_it_needs("from pymatgen.core import Structure", {"pymatgen"})
    assert says_what_it_needs("# pip install 'matris-mlip[discovery]'\nimport pymatgen", {"pymatgen"})


# Installed as sitecustomize for a block that must run on the core install: importing a module
# that only a distribution outside the core provides fails as if it were not installed.
# (find_spec answers with a spec whose loading fails, without an origin: importlib.util.find_spec
# callers that only probe, as torch's dynamo does, go on; an import fails as for a missing module)
CORE_ONLY = textwrap.dedent("""
    import importlib.abc, importlib.machinery, json, os, sys

    BLOCKED = set(json.loads(os.environ["MATRIS_DOCS_BLOCKED_MODULES"]))

    class Absent(importlib.abc.Loader):
        def create_module(self, spec):
            raise ModuleNotFoundError(f"No module named {spec.name!r} (not in the core install)", name=spec.name)

        def exec_module(self, module):
            pass

    class CoreOnly(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                return importlib.machinery.ModuleSpec(name, Absent())
            return None

    sys.meta_path.insert(0, CoreOnly())
""")


def core_only_env(env: dict, folder: Path) -> dict:
    """``env`` for a process that cannot import what only matris-mlip's extras install (as
    installed here): a block that runs there runs on ``pip install matris-mlip``."""
    import json
    from importlib import metadata

    core, extra = core_distributions(transitive=True), extra_distributions()
    blocked = sorted(module for module, dists in metadata.packages_distributions().items()
                     if {_canonical(d) for d in dists} & extra and not {_canonical(d) for d in dists} & core
                     and module not in sys.stdlib_module_names)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(CORE_ONLY)
    path = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return dict(env, PYTHONPATH=path, MATRIS_DOCS_BLOCKED_MODULES=json.dumps(blocked))


def test_core_only_blocks_extras(tmp_path):
    env = core_only_env(dict(os.environ), tmp_path / "site")
    assert run_blocks([("python", "import ase, numpy, torch, matris", "core")], tmp_path, env) is None
    # probing is allowed (torch's dynamo probes many modules), importing fails
    probe = ("import importlib.util\nassert importlib.util.find_spec('pymatgen').origin is None\n"
             "try:\n    import pymatgen\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit(1)")
    assert run_blocks([("python", probe, "probe")], tmp_path, env) is None
    failed = run_blocks([("python", "import pymatgen.core", "extra")], tmp_path, env)
    assert failed and "not in the core install" in failed[1].stderr


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=_where)
@pytest.mark.slow
def test_runnable_examples_run(page, tmp_path):
    """The page's marked blocks in order, each in a fresh process (Python in its own interpreter,
    bash in its own shell), offline, in a fresh directory with the repository's examples/ beside
    them, as a user would run them. The README's Python blocks that need nothing beyond the core
    install run where nothing else can be imported."""
    blocks = [(lang, code, f"{page.relative_to(ROOT)}:{line}") for lang, code, line in runnable_blocks(page)]
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ, MATRIS_OFFLINE="1", MATRIS_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="2",
               MPLBACKEND="Agg", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    core = core_distributions()
    for block in blocks:
        language, code, where = block
        core_only = page == README and language == "python" and not extra_modules(code, core)
        failed = run_blocks([block], work, core_only_env(env, tmp_path / "core-only") if core_only else env)
        if failed:
            proc = failed[1]
            pytest.fail(f"{where}: an example failed\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    """mkdocs build --strict: broken links and anchors, missing API objects, pages left out of
    the nav, unknown placeholders and missing result files all fail."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    site = tmp_path / "site"
    cli = (site / "cli" / "index.html").read_text()
    from matris.cli import SUBCOMMANDS

    for name in SUBCOMMANDS:
        assert f"matris {name}" in cli, name
    assert "matris discovery relax" in cli and "matris data build" in cli
    perf = (site / "performance" / "index.html").read_text()
    assert "benchmarks/results/cpu_speed.json" in perf and "{{" not in perf
    assert "see it on the site" not in perf  # the committed page's stand-in for a figure, not the site's
    # a user page: no commit hashes or working-tree states (the development page keeps those)
    assert "uncommitted" not in perf and "commit <code>" not in perf
    assert "commit <code>" in (site / "development" / "index.html").read_text()
    assert "<math" in (site / "training" / "index.html").read_text()  # formulas became MathML
    assert "MatRISCalculator" in (site / "api" / "calculator" / "index.html").read_text()
    # the figures: drawn into the site and shown where the pages place them
    from benchmarks.figures import FIGURES

    shown: dict[str, set] = {}
    for page in site.rglob("*.html"):
        for name in re.findall(r'<img[^>]+src="[^"]*figures/(\w+)\.svg"', page.read_text()):
            shown.setdefault(name, set()).add(page.parent.name)
    for name in FIGURES:
        svg = site / "figures" / f"{name}.svg"
        assert svg.is_file() and svg.stat().st_size > 10_000, f"figure {name} was not drawn"
        assert "<svg" in svg.read_text()[:2000], name
        assert name in shown, f"figure {name} is drawn but no page shows it"
    assert "performance" in shown["speed_vs_size"]
    for name in ("eos", "phonon_bands", "md_energy"):
        assert "simulations" in shown[name], name
    # fragments say what they need; the citations and the repository are on the site
    assert "Needs: " in (site / "installation" / "index.html").read_text()
    cite = (site / "cite" / "index.html").read_text()
    assert "zhou2026matris" in cite and "2603.02002" in cite
    assert not re.search(r"\{\{\s*\w+\(", cite), "a placeholder was left in the BibTeX"  # ({{MatRIS}} is BibTeX)
    assert "https://github.com/matris-mlip/matris-mlip" in (site / "index.html").read_text()


def test_figures_are_deterministic():
    """The same result files give the same SVG bytes (no dates, fixed ids): rebuilding the site
    changes no figure."""
    from benchmarks import figures

    assert figures.draw("eos") == figures.draw("eos")
    for name in figures.FIGURES:
        caption = figures.caption(name)
        assert "benchmarks/results/" in caption and "commit" not in caption, name


def test_readme_cites_the_paper_as_the_cite_page_does():
    first = re.compile(r"```bibtex\n(.*?)```", re.S)
    assert first.search(README.read_text()).group(1) == first.search((DOCS / "cite.md").read_text()).group(1)


def test_placeholders_fail_loudly():
    sys.path.insert(0, str(DOCS))
    try:
        import hooks
    finally:
        sys.path.remove(str(DOCS))
    assert hooks.expand('{{ value("nve_cpu", "atoms") }}') == "64"
    assert hooks.expand('x \\{{ value("nve_cpu", "atoms") }}') == 'x {{ value("nve_cpu", "atoms") }}'
    with pytest.raises(KeyError, match="no key"):
        hooks.expand('{{ value("nve_cpu", "no.such.key") }}')
    with pytest.raises(KeyError, match="no result file"):
        hooks.expand('{{ value("not_a_result", "x") }}')
    with pytest.raises(KeyError, match="no table renderer"):
        hooks.expand('{{ table("not_a_result") }}')
    with pytest.raises(ValueError, match="unknown placeholder"):
        hooks.expand("{{ nonsense() }}")
    assert hooks.expand('  {{ value("nve_cpu", "atoms") }}') == "  64"
    # views of a result file, and keyword arguments
    official = hooks.expand('{{ table("cpu_speed", "official") }}')
    assert "official, fastest setting" in official and "commit" not in official
    assert "commit `" in hooks.expand('{{ table("cpu_speed", history=True) }}')
    with pytest.raises(KeyError, match="no table view"):
        hooks.expand('{{ table("cpu_speed", "no-such-view") }}')
    with pytest.raises(ValueError, match="bad arguments"):
        hooks.expand('{{ table(**{"name": "cpu_speed"}) }}')
    # figures: an image relative to the page, captioned with its sources
    fig = hooks.expand('{{ figure("eos") }}', "simulations.md")
    assert "](figures/eos.svg)" in fig and "benchmarks/results/figures_demo_cpu.json" in fig
    assert "](../figures/eos.svg)" in hooks.expand('{{ figure("eos") }}', "api/x.md")
    with pytest.raises(KeyError, match="no figure"):
        hooks.expand('{{ figure("no_such_figure") }}')
    assert hooks.fragments("  <!-- fragment: a GPU -->") == '  <p class="matris-needs"><small>Needs: a GPU</small></p>'
    mathml = hooks.to_mathml('<span class="arithmatex">\\(E = mc^2\\)</span>')
    assert mathml.startswith("<math") and "arithmatex" not in mathml


def _hooks():
    sys.path.insert(0, str(DOCS))
    try:
        import hooks
    finally:
        sys.path.remove(str(DOCS))
    return hooks


@pytest.mark.parametrize("page", [p for p in USER_PAGES if p != README], ids=_where)
def test_generated_regions_are_current(page):
    """A page's committed ``<!-- generated: … -->`` regions are what docs/hooks.py makes from
    benchmarks/results/ now: rerun ``python docs/hooks.py PAGE`` after a result file changes."""
    hooks = _hooks()
    text = page.read_text()
    assert hooks.generate(text, page.relative_to(DOCS).as_posix()) == text, (
        f"{_where(page)}: its generated tables are stale; run python docs/hooks.py {_where(page)}")


def test_performance_page_reads_on_github():
    """The performance page carries its numbers in the Markdown (GitHub shows ``{{ … }}`` as is)."""
    text = (DOCS / "performance.md").read_text()
    assert not re.search(r"(?<!\\)\{\{", text), "write a generated region, not a {{ placeholder }}"
    assert text.count("<!-- generated: table(") >= 10 and "benchmarks/results/cpu_speed.json" in text
    hooks = _hooks()
    region = '<!-- generated: value("nve_cpu", "atoms") --><!-- /generated -->'
    assert hooks.generate(region) == '<!-- generated: value("nve_cpu", "atoms") -->64<!-- /generated -->'
    linked = hooks.generate('<!-- generated: figure("eos") -->\n<!-- /generated -->', "simulations.md")
    assert "https://matris-mlip.github.io/matris-mlip/simulations/" in linked and "](figures/" not in linked
    assert "](figures/eos.svg)" in hooks.generate('<!-- generated: figure("eos") -->\n<!-- /generated -->',
                                                  "simulations.md", site=True)


# Words that tie a page to one machine or one moment. A measured number names its machine (CPU
# model, GPU) and its result file; text states what holds, not when it was written.
NOTEBOOK_PHRASES = [
    r"\bthis (?:machine|box|laptop|host|computer|CPU|GPU|node)\b", r"\bat hand\b",
    r"\bthis \d+[- ]?(?:core|cpu|CPU|GB|GiB)", r"\bwhen this was written\b", r"\btoday(?:'s)?\b",
    r"\byesterday\b", r"\bas of (?:now|today|this)\b", r"\bat the time of writing\b", r"\bright now\b",
    r"\bfor now\b", r"\bour (?:machine|box|GPU|CPU)\b", r"\bon my\b", r"\bwe (?:measured|ran|tried)\b",
    r"\bhere,? (?:on|with) (?:a|the|this|our) (?:\d+-core|machine|CPU|GPU)",
]
# (page, phrase) pairs that are not about a machine or a moment
NOTEBOOK_ALLOWED: set[tuple[str, str]] = set()


@pytest.mark.parametrize("page", USER_PAGES, ids=_where)
def test_pages_are_reference_text_not_a_lab_notebook(page):
    where = _where(page)
    found = []
    for number, line in enumerate(page.read_text().split("\n"), 1):
        for pattern in NOTEBOOK_PHRASES:
            for match in re.finditer(pattern, line, re.I):
                if (where, match.group(0).lower()) not in NOTEBOOK_ALLOWED:
                    found.append(f"{where}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    assert not found, ("phrases that tie the page to one machine or one moment; name the machine (CPU "
                       "model, GPU) and the result file, or say what holds:\n" + "\n".join(found))


def _command_parsers() -> dict:
    """``{"relax": parser, "discovery relax": parser, ...}`` of the ``matris`` command."""
    import argparse

    from matris.cli import build_parser

    out = {}

    def walk(parser, name):
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, f"{name} {sub}".strip())

    walk(build_parser(), "")
    return out


COMMAND = re.compile(r"\bmatris ([a-z][a-z-]*(?: [a-z][a-z-]*)?)((?:(?!\bmatris )[^`|#\n])*)")


def unknown_options(text: str, parsers: dict) -> list[str]:
    """``matris CMD --flag`` in ``text`` whose flag CMD does not have (config overrides such as
    ``--trainer.max_steps`` are keys of a config, not flags)."""
    bad = []
    for number, line in enumerate(text.split("\n"), 1):
        for match in COMMAND.finditer(line):
            words = match.group(1)
            command = words if words in parsers else words.split()[0]
            if command not in parsers:
                continue
            options = {o for action in parsers[command]._actions for o in action.option_strings}
            for flag in re.findall(r"(?<![\w.-])(--?[a-zA-Z][\w-]*)(?![\w.])", match.group(2)):
                if flag not in options:
                    bad.append(f"{number}: matris {command} {flag}")
    return bad


@pytest.mark.parametrize("page", USER_PAGES, ids=_where)
def test_command_lines_use_options_that_exist(page):
    """Every ``matris CMD --option`` a page writes is an option of that command's parser."""
    parsers = _command_parsers()
    bad = unknown_options(page.read_text(), parsers)
    assert not bad, f"{_where(page)}: options the command does not have (see matris CMD --help):\n" + "\n".join(bad)


def test_unknown_options_are_found():
    parsers = _command_parsers()
    assert unknown_options("matris relax a.cif --bogus 1 and matris md b --nope", parsers) == [
        "1: matris relax --bogus", "1: matris md --nope"]
    assert unknown_options("matris train --config tiny --trainer.max_steps 5", parsers) == []


def test_readme_is_a_landing_page_whose_links_resolve():
    text = README.read_text()
    assert len(text) <= 12_000, f"README.md is {len(text)} characters; move the detail to docs/"
    # the two set-up commands, unchanged
    assert 'pip install torch==2.13.0 -e . && matris predict' in text
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q' in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://", "mailto:"))]
    assert local, "the README should link into docs/"
    for link in local:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    nav = (ROOT / "mkdocs.yml").read_text()
    for link in local:
        if link.startswith("docs/") and link.endswith(".md"):
            assert link[len("docs/"):] in nav, f"{link} is linked from the README but not in the site's nav"
