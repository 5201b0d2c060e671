"""The version and the distribution name of this package, in one place (pyproject.toml reads
``__version__`` from here; nothing in this module imports anything).

The import name is ``matris``; the distribution on PyPI is ``matris-mlip``, because ``matris``
on PyPI is the official MatRIS project (a different package with the same import folder).
"""

__version__ = "0.7.0"
DISTRIBUTION = "matris-mlip"
