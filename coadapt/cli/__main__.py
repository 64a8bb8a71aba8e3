"""``python -m coadapt.cli``: the ``coadapt`` command without its console script."""

import sys

from coadapt.cli import main

if __name__ == "__main__":
    sys.exit(main())
