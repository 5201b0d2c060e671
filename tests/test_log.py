"""The package's messages go through logging (logger "matris"), not bare prints to stderr."""

import logging
import subprocess
import sys

from matris import log


def test_messages_reach_stderr_and_can_be_silenced(capsys):
    log.info("a progress line")
    assert capsys.readouterr().err == "matris: a progress line\n"
    logger = logging.getLogger("matris")
    before = logger.level
    logger.setLevel(logging.WARNING)
    try:
        log.info("hidden")
        assert capsys.readouterr().err == ""
    finally:
        logger.setLevel(before)


def test_an_application_that_configures_logging_gets_the_messages():
    code = ("import logging, sys; logging.basicConfig(stream=sys.stdout, format='%(name)s|%(message)s', "
            "level=logging.INFO); from matris import log; log.info('hello')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "matris|hello\n" and out.stderr == ""


def test_the_library_prints_nothing_to_stderr_itself():
    """Only the command line (matris/cli) and progress bars write to stderr directly."""
    from pathlib import Path

    root = Path(log.__file__).parent
    offenders = []
    for path in list(root.rglob("*.py")) + list((root.parent / "kernels").rglob("*.py")):
        if "cli" in path.relative_to(root.parent).parts:
            continue
        for k, line in enumerate(path.read_text().splitlines(), 1):
            if "print(" in line and "sys.stderr" in line:
                offenders.append(f"{path.name}:{k}")
    assert offenders == []
