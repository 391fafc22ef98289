"""``gpudra ARGS`` run in-process through ``services.cli.main``: exit code and output.

For tests of argument handling and offline commands; a few tests per command
still start a real process to prove the entry point itself.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

from services.cli import main


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def gpudra(*args: str) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Ran(code, out.getvalue(), err.getvalue())
