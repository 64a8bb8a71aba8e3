"""``python -m coadapt.controller COMMAND ...``: the ``coadapt`` command (an entry point).

Tests and benchmarks start controllers this way; it is the same CLI as ``coadapt`` (one CLI
package, :mod:`coadapt.cli`). Entry points import from the top; nothing imports them.
"""

from __future__ import annotations

from coadapt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
