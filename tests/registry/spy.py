"""Model factories the gate tests publish: one that reports what the gate process can see
(by raising, so the report comes back as the integrity check's reason), one that hangs."""

from __future__ import annotations

import os
import time
from typing import Any


def report_surroundings(secret: str, **_: Any) -> Any:
    """Raise with this process's uid, whether ``secret`` is readable and the token variable."""
    try:
        with open(secret) as f:
            readable = bool(f.read(1))
    except OSError:
        readable = False
    raise RuntimeError(
        f"uid={os.getuid()} secret_readable={readable} "
        f"token={os.environ.get('COADAPT_TOKEN')} db={os.environ.get('COADAPT_DB')} "
        f"cwd={os.getcwd()}"
    )


def hang(**_: Any) -> Any:
    time.sleep(60)
    raise AssertionError("not reached: the gate's timeout kills this process first")
