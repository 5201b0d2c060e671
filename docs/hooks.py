"""MkDocs hooks: the parts of the site that are generated, so they cannot drift.

- ``{{ table("nve_cpu") }}``, ``{{ value("nve_cpu", "drift", ".2g") }}``, ``{{ provenance("nve_cpu") }}``:
  measured numbers, read from the committed result files by ``benchmarks/tables.py``.
- ``{{ table("cpu_speed", "official") }}``: one view of a result file (``benchmarks.tables.VIEWS``).
- ``{{ figure("eos") }}``: a figure drawn from committed result files by ``benchmarks/figures.py``
  (matplotlib, SVG) into the built site as ``figures/NAME.svg``, with its caption and sources.
- ``<!-- fragment: WHAT IT NEEDS -->`` before a code block: the block is not run by the docs test
  (``tests/test_docs.py``) and the page shows "Needs: WHAT IT NEEDS" above it. ``<!-- runnable -->``
  (run as written) and ``<!-- runnable with matris-demo -->`` (run with the bundled model in place
  of the published ones) stay invisible.
- ``{{ cli_reference() }}``: the ``--help`` of every ``matris`` command and subcommand, from the
  argparse parsers themselves.
- ``{{ readme_links() }}``: nothing (a check): every ``docs/*.md`` link in README.md must exist.
- ``<!-- generated: table("cpu_speed", "speed") -->`` … ``<!-- /generated -->``: the same calls,
  with their output committed between the two comments, so that the page reads with its
  numbers on GitHub too (where ``{{ … }}`` would show as is). ``python docs/hooks.py PAGE.md``
  rewrites a page's regions from ``benchmarks/results/``, ``--check`` fails when one is stale
  (``tests/test_docs.py`` checks every page), and the build renders them again. A figure's
  region holds a link to the figure on the site, which draws it.
- Math written as ``$...$`` / ``$$...$$`` (pymdownx.arithmatex) is turned into MathML at build
  time, which browsers render natively: the site needs no JavaScript and no network for it.

An unknown placeholder, a missing result file or key, or a bad formula raises, which fails
the build (``mkdocs build --strict`` runs in the test suite, ``tests/test_docs.py``).
"""

from __future__ import annotations

import argparse
import ast
import html
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _importable() -> None:
    # MkDocs loads this file with its own sys.path; benchmarks/ and matris/ live at the repo root
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))

# ``\{{`` writes a literal ``{{`` (to show a placeholder in the docs without expanding it)
PLACEHOLDER = re.compile(r"(?<!\\)\{\{\s*(\w+)\((.*?)\)\s*\}\}")


def cli_reference(width: int = 88) -> str:
    """Every command's ``--help``, generated from :func:`matris.cli.build_parser`."""
    _importable()
    from matris.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)  # argparse wraps to the terminal: fix it for a stable page
    try:
        parts: list[str] = []

        def walk(parser: argparse.ArgumentParser, level: int) -> None:
            parts.append(f"{'#' * level} `{parser.prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for sub in action.choices.values():
                        walk(sub, min(level + 1, 4))

        walk(build_parser(), 2)
        return "\n".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def version() -> str:
    """This package's version (``matris/_version.py``, read without importing matris)."""
    text = (ROOT / "matris" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _caption_html(text: str) -> str:
    """A caption's markdown (backticks only) as HTML."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def figure(name: str, where: str = "page") -> str:
    """A figure of ``benchmarks/figures.py``: the image (drawn into the site by :func:`on_files`)
    and its caption, with the result files, command, model and machine behind it."""
    _importable()
    from benchmarks import figures

    if name not in figures.FIGURES:
        raise KeyError(f"{where}: no figure {name!r}; known: {', '.join(figures.FIGURES)}")
    prefix = "../" * where.replace("\\", "/").count("/")
    return (f'<figure class="matris-figure" markdown="span">\n'
            f'![{name.replace("_", " ")}]({prefix}figures/{name}.svg)\n'
            f'<figcaption>{_caption_html(figures.caption(name))}</figcaption>\n</figure>')


def _functions(where: str = "page") -> dict:
    _importable()
    from benchmarks import tables

    return {
        "table": tables.table,
        "value": tables.value,
        "provenance": tables.provenance,
        "cli_reference": cli_reference,
        "figure": lambda name: figure(name, where),
        "version": version,
    }


# a code block marked as a fragment: the docs test does not run it, the page says what it needs
FRAGMENT = re.compile(r"^([ \t]*)<!--\s*fragment:\s*(.+?)\s*-->[ \t]*$", re.M)


def fragments(markdown: str) -> str:
    """``<!-- fragment: WHAT -->`` → a small "Needs: WHAT" line (indentation kept)."""
    return FRAGMENT.sub(lambda m: f'{m.group(1)}<p class="matris-needs"><small>Needs: '
                                  f'{_caption_html(m.group(2))}</small></p>', markdown)


def _call(functions: dict, name: str, args: str, text: str, where: str) -> str:
    """One placeholder's output: ``name(args)`` with literal arguments, as ``text`` wrote it."""
    if name not in functions:
        raise ValueError(f"{where}: unknown placeholder {{{{ {name}(...) }}}}; known: {', '.join(functions)}")
    try:  # literal arguments, positional and by keyword: table("cpu_speed", history=True)
        call = ast.parse(f"f({args})", mode="eval").body
        parsed = [ast.literal_eval(a) for a in call.args]
        keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        if None in keywords:
            raise ValueError("no ** arguments")
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"{where}: bad arguments in {text}: {exc}") from exc
    return str(functions[name](*parsed, **keywords))


def expand(markdown: str, where: str = "page") -> str:
    """Fill in every ``{{ name(args) }}`` placeholder; unknown names and bad arguments raise."""
    functions = _functions(where)

    def replace(match: re.Match) -> str:
        text = _call(functions, match.group(1), match.group(2), match.group(0), where)
        # a placeholder indented inside a block (an admonition, a list) keeps its indentation
        line_start = markdown.rfind("\n", 0, match.start()) + 1
        indent = markdown[line_start:match.start()]
        if indent and not indent.strip():
            text = text.replace("\n", "\n" + indent)
        return text

    return PLACEHOLDER.sub(replace, markdown).replace("\\{{", "{{")


# a region whose output is committed in the page: <!-- generated: name(args) -->OUTPUT<!-- /generated -->
GENERATED = re.compile(r"<!-- generated: (\w+)\((.*?)\) -->(.*?)<!-- /generated -->", re.S)


def site_url() -> str:
    """The site's address (``site_url`` in mkdocs.yml), ending in ``/``."""
    url = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.M).group(1)
    return url.rstrip("/") + "/"


def _figure_link(name: str, where: str) -> str:
    """A figure's stand-in where the site's drawing is not at hand (the page read on GitHub)."""
    _importable()
    from benchmarks import figures

    if name not in figures.FIGURES:
        raise KeyError(f"{where}: no figure {name!r}; known: {', '.join(figures.FIGURES)}")
    page = where.replace("\\", "/").removesuffix(".md").removesuffix("index")
    url = f"{site_url()}{page}/" if page else site_url()
    return (f"*Figure ({name.replace('_', ' ')}): drawn when the site is built, [see it on the site]({url}).* "
            f"{figures.caption(name)}")


def generate(markdown: str, where: str = "page", site: bool = False) -> str:
    """Every ``<!-- generated: … -->`` region of a page rendered again from the result files:
    for the committed page (``site=False``: a figure is a link to the site) or for the site."""
    functions = _functions(where)
    if not site:
        functions["figure"] = lambda name: _figure_link(name, where)

    def replace(match: re.Match) -> str:
        name, args, old = match.group(1), match.group(2), match.group(3)
        text = _call(functions, name, args, match.group(0)[:match.group(0).index("-->") + 3], where)
        line_start = markdown.rfind("\n", 0, match.start()) + 1
        block = not markdown[line_start:match.start()].strip() and old.startswith("\n")
        if block:  # on lines of its own, with blank lines around (Markdown in an HTML comment's wake)
            text = f"\n\n{text}\n\n"
        elif "\n" in text:
            raise ValueError(f"{where}: {name}({args}) gives several lines; put its region on lines of its own")
        return f"<!-- generated: {name}({args}) -->{text}<!-- /generated -->"

    return GENERATED.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files):
    where = page.file.src_path
    return fragments(expand(generate(markdown, where, site=True), where))


def main(argv: list[str] | None = None) -> int:
    """``python docs/hooks.py [--check] PAGE.md...``: render the generated regions of pages."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only report pages whose regions are stale")
    args = parser.parse_args(argv)
    stale = []
    for path in args.pages:
        text = path.read_text()
        new = generate(text, path.resolve().relative_to(ROOT / "docs").as_posix())
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    for path in stale:
        print(f"{path}: {'stale' if args.check else 'rewritten'}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())


def on_files(files, config):
    """Draw every figure of ``benchmarks/figures.py`` into the site as ``figures/NAME.svg``."""
    _importable()
    from mkdocs.structure.files import File

    from benchmarks import figures

    for name in figures.FIGURES:
        files.append(File.generated(config, f"figures/{name}.svg", content=figures.draw(name)))
    return files


_MATH_BLOCK = re.compile(r'<div class="arithmatex">\s*\\\[(.*?)\\\]\s*</div>', re.S)
_MATH_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)


def to_mathml(html_text: str, where: str = "page") -> str:
    """arithmatex's generic output (``\\(…\\)`` spans, ``\\[…\\]`` divs) → MathML."""
    from latex2mathml.converter import convert

    def convert_one(match: re.Match, display: str) -> str:
        tex = html.unescape(match.group(1)).strip()
        try:
            return convert(tex, display=display)
        except Exception as exc:  # latex2mathml raises many types; name the formula and the page
            raise ValueError(f"{where}: cannot convert the formula {tex!r} to MathML: {exc}") from exc

    html_text = _MATH_BLOCK.sub(lambda m: f'<div class="math">{convert_one(m, "block")}</div>', html_text)
    return _MATH_INLINE.sub(lambda m: convert_one(m, "inline"), html_text)


# docstrings use Sphinx roles (:class:`MatRIS`); mkdocstrings renders them as ":class:<code>…</code>"
_SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):(?=<code>)")


def on_page_content(html_text, page, config, files):
    return _SPHINX_ROLE.sub("", to_mathml(html_text, page.file.src_path))
