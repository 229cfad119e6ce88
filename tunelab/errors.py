"""The one kind of error a user sees as one line: ``tunelab: error: <what>; fix: <how>`` (exit 2).

Every refusal of bad input (a recipe, a sweep file, a strategy, an option, a checkpoint) raises a subclass of
:class:`InputError`; ``tunelab.cli.main`` prints it as one line. Anything else that escapes a command is a bug or
a fault of the machine: it is printed as one line too, with the hint to rerun with ``--debug`` for the traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input, refused before anything is built: the message names the file or option, the key and the fix."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run or sweep, after what was measured so far has been recorded."""

    exit_code = 130
