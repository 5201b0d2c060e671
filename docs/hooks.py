"""MkDocs hooks: the parts of the site that are generated, so they cannot drift.

- ``{{ table("nve_cpu") }}``, ``{{ value("nve_cpu", "drift", ".2g") }}``, ``{{ provenance("nve_cpu") }}``:
  measured numbers, read from the committed result files by ``benchmarks/tables.py``.
- ``{{ cli_reference() }}``: the ``--help`` of every ``matris`` command and subcommand, from the
  argparse parsers themselves.
- ``{{ readme_links() }}``: nothing (a check): every ``docs/*.md`` link in README.md must exist.
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


def _functions() -> dict:
    _importable()
    from benchmarks import tables

    return {
        "table": tables.table,
        "value": tables.value,
        "provenance": tables.provenance,
        "cli_reference": cli_reference,
    }


def expand(markdown: str, where: str = "page") -> str:
    """Fill in every ``{{ name(args) }}`` placeholder; unknown names and bad arguments raise."""
    functions = _functions()

    def replace(match: re.Match) -> str:
        name, args = match.group(1), match.group(2)
        if name not in functions:
            raise ValueError(f"{where}: unknown placeholder {{{{ {name}(...) }}}}; known: {', '.join(functions)}")
        try:
            parsed = ast.literal_eval(f"({args},)") if args.strip() else ()
        except (SyntaxError, ValueError) as exc:
            raise ValueError(f"{where}: bad arguments in {match.group(0)}: {exc}") from exc
        text = str(functions[name](*parsed))
        # a placeholder indented inside a block (an admonition, a list) keeps its indentation
        line_start = markdown.rfind("\n", 0, match.start()) + 1
        indent = markdown[line_start:match.start()]
        if indent and not indent.strip():
            text = text.replace("\n", "\n" + indent)
        return text

    return PLACEHOLDER.sub(replace, markdown).replace("\\{{", "{{")


def on_page_markdown(markdown, page, config, files):
    return expand(markdown, page.file.src_path)


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
