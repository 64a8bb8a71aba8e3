"""Where the controller keeps its files, and its default port (light: the CLI imports it)."""

from __future__ import annotations

import os
from pathlib import Path

from coadapt.protocol import ENV_STATE_DIR

DEFAULT_PORT = 7373
ADMIN_TOKEN_FILE = "admin-token"  # mode 0600, written on first start
SERVER_FILE = "server.json"  # {"url", "pid"} of the controller serving this state dir


def default_state_dir() -> Path:
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else Path.home() / ".coadapt"
