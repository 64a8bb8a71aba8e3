"""Measured co-location throughputs for GPU sharing: what ``coadapt server --colocation FILE``
reads, and the job spec's ``packing_key`` names.

The policy packs a waiting 1-GPU job onto a running one only when it knows how fast both run
together (:attr:`coadapt.policies.ClusterSnapshot.colocation`, Gandiva's packing). Those figures
are measured, not guessed, so they come from a file: one row per pair of packing keys,

    {"a": "cifar10", "b": "ncf", "a_fraction": 0.66, "b_fraction": 0.59}

where ``a_fraction`` is the share of its isolated throughput a job of key ``a`` keeps while a
job of key ``b`` shares its GPU (and ``b_fraction`` the reverse). A JSON file holds a list of
such rows (or ``{"rows": [...]}``); a ``.csv`` file has the header ``a,b,a_fraction,b_fraction``.
The table holds both orders of every pair (the policies look either order up), so a pair may
be given once in either order; given twice, both rows must agree.

``examples/colocation_gavel.json`` is Gavel's measured table on the simulator's application
names (:func:`coadapt.sim.gpu_types.colocation_table`, the figures the simulator packs with).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from coadapt.controller.errors import SpecError

#: A packing key: the job's application or profile class (e.g. ``cifar10``, ``resnet18``).
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
KEY_ACCEPTED = "1-64 characters: letters, digits, '.', '_', '-' (starting with a letter or digit)"
FIELDS = ("a", "b", "a_fraction", "b_fraction")
ROW_ACCEPTED = (
    '{"a": KEY, "b": KEY, "a_fraction": X, "b_fraction": Y}, X and Y in (0, 1] (the share of '
    f"its isolated throughput each job keeps while they share a GPU; KEY is {KEY_ACCEPTED})"
)
MAX_ROWS = 100_000  # a table is a few hundred rows; more is a wrong file

#: (key a, key b) -> (fraction of a's isolated throughput, fraction of b's) when they share.
ColocationTable = dict[tuple[str, str], tuple[float, float]]

__all__ = [
    "FIELDS",
    "KEY_ACCEPTED",
    "KEY_NAME",
    "ColocationTable",
    "check_key",
    "load_colocation",
    "packing_note",
    "parse_rows",
]


def check_key(key: object) -> str:
    """``key`` if it is a valid packing key, else :class:`ValueError` saying what is accepted."""
    if not isinstance(key, str) or not KEY_NAME.match(key):
        raise ValueError(f"invalid packing key {key!r}; accepted: {KEY_ACCEPTED}")
    return key


def _fraction(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    x = float(value)
    if not math.isfinite(x) or not 0.0 < x <= 1.0:
        raise ValueError(f"{x} is outside (0, 1]")
    return x


def parse_rows(rows: Sequence[Any], source: str = "colocation table") -> ColocationTable:
    """The table of ``rows`` (mappings with :data:`FIELDS`), both orders of each pair; a bad
    row raises :class:`SpecError` naming ``source``, the row (1-based) and the field."""

    def bad(where: str, field: str, why: str) -> SpecError:
        message = f"--colocation {source}: {where}, field {field}: {why}"
        detail = {"field": field, "message": f"{where}: {why}", "accepted": ROW_ACCEPTED}
        return SpecError(message, [detail])

    if len(rows) > MAX_ROWS:
        raise bad(f"{len(rows)} rows", "rows", f"more than {MAX_ROWS} rows")
    table: ColocationTable = {}
    origin: dict[tuple[str, str], int] = {}
    for n, row in enumerate(rows, start=1):
        where = f"row {n}"
        if not isinstance(row, Mapping):
            raise bad(where, "row", f"got {type(row).__name__}, not a mapping")
        extra = sorted(str(k) for k in row if k not in FIELDS)
        if extra:
            raise bad(where, extra[0], f"unknown field (fields: {', '.join(FIELDS)})")
        for field in FIELDS:
            if field not in row:
                raise bad(where, field, "missing")
        keys = []
        for field in ("a", "b"):
            try:
                keys.append(check_key(row[field]))
            except ValueError as exc:
                raise bad(where, field, str(exc)) from None
        a, b = keys
        fractions = []
        for field in ("a_fraction", "b_fraction"):
            try:
                fractions.append(_fraction(row[field]))
            except ValueError as exc:
                raise bad(where, field, str(exc)) from None
        fa, fb = fractions
        if a == b and fa != fb:
            raise bad(where, "b_fraction", f"two {a} jobs share alike: {fb} != a_fraction {fa}")
        for pair, value in (((a, b), (fa, fb)), ((b, a), (fb, fa))):
            seen = table.get(pair)
            if seen is not None and seen != value:
                raise bad(
                    where,
                    "a_fraction",
                    f"pair ({a}, {b}) disagrees with row {origin[pair]} "
                    f"({seen[0]}, {seen[1]} for ({pair[0]}, {pair[1]}))",
                )
            table[pair] = value
            origin.setdefault(pair, n)
    return table


def load_colocation(path: Path) -> ColocationTable:
    """Read a co-location file (JSON rows, or CSV with a header; see the module docstring);
    an unreadable file or a bad row raises :class:`SpecError` naming the file and the row."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"--colocation {path}: cannot read the file: {exc}") from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in reader.fieldnames or ()]
        if sorted(header) != sorted(FIELDS):
            raise SpecError(
                f"--colocation {path}: the CSV header is {','.join(header) or '(empty)'}; "
                f"accepted: {','.join(FIELDS)}"
            )
        rows: Any = [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in reader]
    else:
        try:
            rows = json.loads(text)
        except ValueError as exc:
            raise SpecError(
                f"--colocation {path}: not JSON ({exc}); accepted: a list of rows {ROW_ACCEPTED}, "
                "or a .csv file with the header a,b,a_fraction,b_fraction"
            ) from None
        if isinstance(rows, dict) and set(rows) == {"rows"}:
            rows = rows["rows"]
        if not isinstance(rows, list):
            raise SpecError(
                f"--colocation {path}: got a JSON {type(rows).__name__}; accepted: a list of "
                f'rows (or {{"rows": [...]}}), each {ROW_ACCEPTED}'
            )
    table = parse_rows(rows, str(path))
    if not table:
        raise SpecError(f"--colocation {path}: no rows; accepted: at least one {ROW_ACCEPTED}")
    return table


def packing_note(key: str | None, known: Collection[str], shares_slots: bool) -> str | None:
    """Why a job with packing key ``key`` will never share a GPU here (None: it may).

    ``known``: the keys of the controller's table; ``shares_slots``: whether its executor
    can run two jobs on one slot."""
    if key is None:
        return None
    if not shares_slots:
        return f"packing_key {key!r}: this executor cannot share a slot, so the job never packs"
    if not known:
        return (
            f"packing_key {key!r}: the controller has no co-location table "
            "(coadapt server --colocation FILE), so the job never packs"
        )
    if key not in known:
        listed = sorted(known)
        more = f", ... ({len(listed)} keys)" if len(listed) > 12 else ""
        return (
            f"packing_key {key!r} is not in the controller's co-location table (keys: "
            f"{', '.join(listed[:12])}{more}), so the job never packs"
        )
    return None
