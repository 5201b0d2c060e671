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


DRIVER = textwrap.dedent("""
    import json, subprocess, sys
    blocks = json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__"}
    for language, code, where in blocks:
        print(f"--- running {where} ({language})", flush=True)
        if language == "python":
            exec(compile(code, where, "exec"), namespace)
        elif language == "bash":
            subprocess.run(["bash", "-euo", "pipefail", "-c", code], check=True)
        else:
            raise SystemExit(f"{where}: cannot run a {language!r} block")
""")


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=_where)
@pytest.mark.slow
def test_runnable_examples_run(page, tmp_path):
    """The page's marked blocks in order (Python in one interpreter, bash in a shell), offline,
    in a fresh directory with the repository's examples/ beside them, as a user would run them."""
    import json

    blocks = [(lang, code, f"{page.relative_to(ROOT)}:{line}") for lang, code, line in runnable_blocks(page)]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ, MATRIS_OFFLINE="1", MATRIS_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="2",
               MPLBACKEND="Agg", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(blocks), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{page.name}: an example failed\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


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
    # a user page: no commit hashes or working-tree states (the development page keeps those)
    assert "uncommitted" not in perf and "commit <code>" not in perf
    assert "commit <code>" in (site / "development" / "index.html").read_text()
    assert "<math" in (site / "training" / "index.html").read_text()  # formulas became MathML
    assert "MatRISCalculator" in (site / "api" / "calculator" / "index.html").read_text()
    # the figures: drawn into the site and shown where the pages place them
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
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
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
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
