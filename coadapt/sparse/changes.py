"""Which rows of a table changed since an export: what an incremental model version must carry.

A shard records the keys of every row it writes (a push), creates (a pull of an admitted new
ID) or drops (expiry) in a :class:`ChangeLog`, one per table. An export seals what was recorded
under the export's id; the next export *based on* that id carries the union of everything
recorded after it. Keys, not slot numbers: slots move (cuckoo displacement, segment growth), keys
do not, and a key that was changed and then deleted is simply looked up at export time (present:
its current row goes out; absent: a deletion).

Why a key log rather than a per-row version counter or dirty bit: it costs nothing per row of
the table (a 4-byte counter would add 10 % to a 40-byte serving row), only 8 bytes per *changed*
row since the base export; the log is deduplicated in place whenever it doubles, so it never
holds more than about twice the distinct changed keys. An export that fails after some shards
wrote keeps working: the next delta names the last *committed* export as its base, and every
segment recorded after it is still here (segments before the base are dropped then). Until a
table's first export nothing is recorded (that export is necessarily full), so training that
never publishes pays nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ChangeLog", "UnknownBaseError"]

U64 = npt.NDArray[np.uint64]
_EMPTY = np.zeros(0, np.uint64)
_COMPACT_MIN = 1 << 20


class UnknownBaseError(LookupError):
    """The shard has no record of the export a delta should be based on (it restarted from a
    checkpoint, or the base was never exported here): publish a full version."""


class ChangeLog:
    """Keys changed since each of the last exports (see the module docstring)."""

    def __init__(self) -> None:
        self._segments: list[tuple[str, U64]] = []  # (export id that sealed it, unique keys)
        self._buf: list[U64] = []
        self._pending = 0
        self._compact_at = _COMPACT_MIN

    def record(self, keys: npt.ArrayLike) -> None:
        """Remember that the rows of ``keys`` changed (a copy is kept: callers reuse buffers).
        Free before the first export: with no export to be relative to, the next one is full."""
        if not self._segments:
            return
        k = np.array(keys, dtype=np.uint64, copy=True).reshape(-1)
        if k.size == 0:
            return
        self._buf.append(k)
        self._pending += k.size
        if self._pending >= self._compact_at:
            cur = np.unique(np.concatenate(self._buf))
            self._buf = [cur]
            self._pending = cur.size
            self._compact_at = max(_COMPACT_MIN, 2 * cur.size)

    def _current(self) -> U64:
        return np.unique(np.concatenate(self._buf)) if self._buf else _EMPTY

    def bases(self) -> list[str]:
        """Export ids a delta may be based on, oldest first."""
        return [s for s, _ in self._segments]

    def since(self, base: str) -> U64:
        """Unique keys changed after export ``base`` (sorted)."""
        ids = self.bases()
        if base not in ids:
            raise UnknownBaseError(
                f"no record of export {base!r} on this shard (it knows {ids or 'none'}): the "
                "shard restarted or never exported it; publish a full version"
            )
        later = [k for _, k in self._segments[ids.index(base) + 1 :]]
        parts = [*later, *self._buf]
        return np.unique(np.concatenate(parts)) if parts else _EMPTY

    def seal(self, export_id: str, base: str | None, keys: U64 | None = None) -> None:
        """Export ``export_id`` happened. A full one (``base`` None) forgets everything. A delta
        on ``base`` stores what it carried (``keys``, default: everything recorded since
        ``base``) under ``export_id`` and keeps ``base`` only as an empty marker, so that if
        ``export_id`` is never committed the next delta on ``base`` still finds every change;
        exports older than ``base`` are dropped (the publisher committed ``base``)."""
        if base is None:
            self._segments = [(export_id, _EMPTY)]
        else:
            carried = self.since(base) if keys is None else keys
            self._segments = [(base, _EMPTY), (export_id, carried)]
        self._buf = []
        self._pending = 0
        self._compact_at = _COMPACT_MIN

    def forget(self) -> None:
        """Drop every record (the state was replaced, e.g. rolled back): the next export is full."""
        self._segments = []
        self._buf = []
        self._pending = 0

    def nbytes(self) -> int:
        """Bytes held by the log (the memory overhead of change tracking)."""
        return sum(k.nbytes for _, k in self._segments) + sum(k.nbytes for k in self._buf)
