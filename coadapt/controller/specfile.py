"""Reading a job spec file (YAML or JSON) on the client side; validation is the server's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from coadapt.controller.errors import SpecError


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML/JSON spec and resolve ``working_dir`` against the spec's own folder.

    Returns the raw mapping (validated by the server, which owns the rules); a spec without
    ``working_dir`` runs in the folder that holds it, so ``coadapt submit examples/x.yaml``
    works from anywhere.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(
            f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: a job spec must be a mapping of fields")
    base = p.resolve().parent
    wd = data.get("working_dir")
    if wd is None:
        data["working_dir"] = str(base)
    elif isinstance(wd, str) and not os.path.isabs(wd):
        data["working_dir"] = str((base / wd).resolve())
    return data
