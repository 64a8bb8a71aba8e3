"""Reading a job spec file (YAML or JSON) on the client side; validation is the server's.

A file that cannot be read as a spec is a :class:`SpecError` (the CLI prints it on one line
and exits 2) naming the file and, for a syntax error, ``file:line:column`` and the problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from coadapt.controller.errors import SpecError


def _yaml_error(p: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    what = f"{problem} ({context})" if context else str(problem)
    if mark is None:
        return f"{p}: not valid YAML: {what}"
    return f"{p}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what}"


def read_spec_mapping(path: str | Path, what: str = "a job spec") -> dict[str, Any]:
    """The mapping a YAML (or ``.json``) file holds, or a one-line :class:`SpecError`."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(
            f"{p}:{line}:{column}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"
        ) from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
        except (ValueError, RecursionError) as exc:
            raise SpecError(f"{p}: not valid JSON: {exc or 'nests too deeply'}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(_yaml_error(p, exc)) from None
        except RecursionError:
            raise SpecError(f"{p}: not valid YAML: nests too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: {what} must be a mapping of fields")
    return data


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML/JSON spec and resolve ``working_dir`` against the spec's own folder.

    Returns the raw mapping (validated by the server, which owns the rules); a spec without
    ``working_dir`` runs in the folder that holds it, so ``coadapt submit examples/x.yaml``
    works from anywhere.
    """
    p = Path(path)
    data = read_spec_mapping(p)
    base = p.resolve().parent
    wd = data.get("working_dir")
    if wd is None:
        data["working_dir"] = str(base)
    elif isinstance(wd, str) and not os.path.isabs(wd):
        data["working_dir"] = str((base / wd).resolve())
    return data
