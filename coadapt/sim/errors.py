"""Errors of the simulator: bad user input versus a simulation that cannot go on."""

from __future__ import annotations


class SimInputError(ValueError):
    """A workload, cluster spec or option is malformed.

    The message is one line that names the file, line and value at fault and the accepted
    forms, so the CLI can print it as is (no traceback) and exit with status 2.
    """


class SimulationError(RuntimeError):
    """The simulation reached a state the traces cannot answer (a bug or an impossible job)."""
