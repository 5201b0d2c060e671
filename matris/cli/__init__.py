"""The ``matris`` command."""
def main(argv=None):
    raise SystemExit(0)
