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
FENCE = re.compile(r"^```(\w+)\s*$")


def runnable_blocks(page: Path) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of every fenced block preceded by the runnable marker."""
    lines = page.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == MARKER:
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            m = FENCE.match(lines[j].strip()) if j < len(lines) else None
            if not m:
                raise AssertionError(f"{page.name}:{i + 1}: {MARKER} must be followed by a fenced code block")
            end = j + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            blocks.append((m.group(1), "\n".join(lines[j + 1:end]), j + 1))
            i = end
        i += 1
    return blocks


PAGES_WITH_EXAMPLES = sorted(p for p in DOCS.rglob("*.md") if MARKER in p.read_text())


def test_some_pages_have_runnable_examples():
    names = {p.name for p in PAGES_WITH_EXAMPLES}
    assert {"quickstart.md", "finetune-tutorial.md", "calculator.md"} <= names


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


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: str(p.relative_to(DOCS)))
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
    assert "<math" in (site / "training" / "index.html").read_text()  # formulas became MathML
    assert "MatRISCalculator" in (site / "api" / "calculator" / "index.html").read_text()


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
