"""Versioned model artifacts: raw tensor files plus a manifest written last.

A model directory ``ROOT`` holds one sub-directory per version, named by a zero-padded
sequence number (``00000001``, ...). A version directory holds data files (dense tensors in
``dense.bin``, raw little-endian bytes at 64-byte aligned offsets, like safetensors; sparse
shards will be one file each) and ``manifest.json``, which says everything needed to rebuild
the model: the factory's import path and keyword arguments, the input the model takes, every
file's sha256 and size, every tensor's dtype, shape and place, the parent of an incremental
version, the digest of the whole resolved state, and the lineage (job, step, data offset).

The manifest is written **last** and atomically (temp file, fsync, rename, directory fsync):
a version without one is still being written (or was abandoned by a crash) and is invisible.
An incremental version (``kind="delta"``) holds only the tensors that changed since its
parent; loading it loads the parent's state, replaces those tensors and checks the result
against the recorded digest, so a delta applied to the wrong base is refused.

``ROOT/LIVE`` (written atomically too) names the version servers should serve; without it they
serve the newest complete version. :func:`set_live` is promotion and rollback.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from coadapt.atomicfile import atomic_write, fsync_dir

FORMAT = 1
MANIFEST = "manifest.json"
DENSE_FILE = "dense.bin"
LIVE_FILE = "LIVE"
ALIGN = 64
_VERSION_DIGITS = 8

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class ArtifactError(ValueError):
    """A version that cannot be written, found or used; the message says what and how to fix."""


class IntegrityError(ArtifactError):
    """A version whose bytes do not match its manifest (checksum, size, shape, NaN/Inf)."""


@dataclass(frozen=True)
class FileEntry:
    """One data file of a version: its name inside the version directory, sha256 and size."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's raw bytes lie: file, byte offset, and what they are."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class InputSpec:
    """What one request row looks like: dtype and shape without the batch dimension."""

    dtype: str = "float32"
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class Lineage:
    """What produced a version: the training job, its step and how far into the data it was."""

    job_id: str | None = None
    step: int | None = None
    data_offset: int | None = None


@dataclass(frozen=True)
class Manifest:
    """A complete version's description (``manifest.json``)."""

    version: str
    kind: str  # "full" or "delta"
    parent: str | None
    factory: str  # "package.module:callable" returning an nn.Module
    factory_kwargs: dict[str, Any]
    inputs: InputSpec
    files: tuple[FileEntry, ...]
    tensors: tuple[TensorEntry, ...]
    state_sha256: str  # digest of the whole resolved state (see state_digest)
    lineage: Lineage = field(default_factory=Lineage)
    created_at: float = 0.0
    format: int = FORMAT
    # a sparse model's tables, shard files, inputs and delta chain (coadapt.serve.sparse_artifacts);
    # None for a dense model
    sparse: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """Parse and check a manifest; ``where`` names it in errors."""
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise ArtifactError(
                    f"{where}: manifest format {raw.get('format')!r}, this coadapt reads "
                    f"format {FORMAT}: upgrade coadapt or republish the version"
                )
            if raw["kind"] not in ("full", "delta"):
                raise ArtifactError(f"{where}: kind must be 'full' or 'delta', not {raw['kind']!r}")
            if raw["kind"] == "delta" and not raw["parent"]:
                raise ArtifactError(f"{where}: an incremental version needs a parent")
            return cls(
                version=str(raw["version"]),
                kind=raw["kind"],
                parent=raw["parent"],
                factory=str(raw["factory"]),
                factory_kwargs=dict(raw["factory_kwargs"]),
                inputs=InputSpec(raw["inputs"]["dtype"], tuple(raw["inputs"]["shape"])),
                files=tuple(FileEntry(**f) for f in raw["files"]),
                tensors=tuple(
                    TensorEntry(**{**t, "shape": tuple(t["shape"])}) for t in raw["tensors"]
                ),
                state_sha256=str(raw["state_sha256"]),
                lineage=Lineage(**raw.get("lineage", {})),
                created_at=float(raw.get("created_at", 0.0)),
                sparse=dict(raw["sparse"]) if raw.get("sparse") is not None else None,
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"{where}: malformed manifest ({exc!r}); republish it") from exc


# ----------------------------------------------------------------------------- file helpers


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (it must be contiguous and on the CPU)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy().data)


def _as_state(model_or_state: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, Any]:
    state = (
        model_or_state.state_dict()
        if isinstance(model_or_state, torch.nn.Module)
        else dict(model_or_state)
    )
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ArtifactError(f"state entry {name!r} is a {type(t).__name__}, not a tensor")
        if t.dtype not in _DTYPE_NAMES:
            raise ArtifactError(
                f"tensor {name!r} has dtype {t.dtype}; supported: {', '.join(DTYPES)}"
            )
        out[name] = t.detach().to("cpu").contiguous()
    return out


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].contiguous()
        h.update(f"{name}\0{_DTYPE_NAMES[t.dtype]}\0{tuple(t.shape)}\0".encode())
        h.update(_raw(t))
    return h.hexdigest()


def check_finite(state: Mapping[str, torch.Tensor], where: str) -> None:
    """Refuse NaN or Inf in any floating tensor (a diverged run must not go live)."""
    for name, t in state.items():
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            raise IntegrityError(f"{where}: tensor {name!r} holds NaN or Inf")


# ----------------------------------------------------------------------------- versions


def version_dirs(root: Path) -> Iterator[Path]:
    """Every version directory under ``root``, complete or not."""
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.isdigit():
                yield p


def list_versions(root: str | os.PathLike[str]) -> list[str]:
    """The complete versions (those with a manifest), oldest first."""
    return sorted(p.name for p in version_dirs(Path(root)) if (p / MANIFEST).is_file())


def read_manifest(root: str | os.PathLike[str], version: str) -> Manifest:
    """The manifest of a complete version (an ``ArtifactError`` if there is none)."""
    path = Path(root) / version / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        known = list_versions(root)
        raise ArtifactError(
            f"no complete version {version!r} in {root} (complete: {known or 'none'})"
        ) from None
    m = Manifest.from_json(text, str(path))
    if m.version != version:
        raise ArtifactError(f"{path} says it is version {m.version!r}: it was moved; republish")
    return m


def set_live(root: str | os.PathLike[str], version: str) -> None:
    """Make ``version`` the one servers load (promotion, rollback); it must be complete."""
    read_manifest(root, version)
    atomic_write(Path(root) / LIVE_FILE, f"{version}\n".encode())


def live_version(root: str | os.PathLike[str]) -> str | None:
    """The version servers should serve: the ``LIVE`` pointer, else the newest complete one."""
    pointer = Path(root) / LIVE_FILE
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        versions = list_versions(root)
        return versions[-1] if versions else None
    return name or None


def _claim_version_dir(root: Path) -> Path:
    """Create the next numbered directory; ``mkdir`` is atomic, so concurrent publishers
    never share one."""
    root.mkdir(parents=True, exist_ok=True)
    nums = [int(p.name) for p in version_dirs(root)]
    n = max(nums, default=0) + 1
    while True:
        path = root / f"{n:0{_VERSION_DIGITS}d}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


def _factory_of(model: torch.nn.Module) -> str:
    cls = type(model)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ArtifactError(
            f"{cls.__qualname__} is defined in a script or a function: a server cannot import "
            "it. Move it into an importable module or pass factory='package.module:callable'"
        )
    return f"{cls.__module__}:{cls.__qualname__}"


def _infer_input(model: torch.nn.Module) -> InputSpec:
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            return InputSpec("float32", (m.in_features,))
    raise ArtifactError("cannot infer the input shape: pass input_shape=(features, ...)")


def _write_dense(
    vdir: Path, tensors: Mapping[str, torch.Tensor]
) -> tuple[FileEntry, tuple[TensorEntry, ...]]:
    """Write ``tensors`` into ``vdir/dense.bin`` at aligned offsets, fsynced; what was written."""
    entries: list[TensorEntry] = []
    h = hashlib.sha256()
    offset = 0
    with open(vdir / DENSE_FILE, "wb") as f:
        for name in sorted(tensors):
            t = tensors[name]
            pad = (-offset) % ALIGN
            if pad:
                f.write(b"\0" * pad)
                h.update(b"\0" * pad)
                offset += pad
            raw = _raw(t)
            f.write(raw)
            h.update(raw)
            entries.append(
                TensorEntry(name, _DTYPE_NAMES[t.dtype], tuple(t.shape), DENSE_FILE, offset,
                            raw.nbytes)
            )  # fmt: skip
            offset += raw.nbytes
        f.flush()
        os.fsync(f.fileno())
    return FileEntry(DENSE_FILE, h.hexdigest(), offset), tuple(entries)


def publish(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    root: str | os.PathLike[str],
    *,
    factory: str | None = None,
    factory_kwargs: Mapping[str, Any] | None = None,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32",
    parent: str | None = None,
    incremental: bool = False,
    lineage: Lineage | None = None,
) -> Manifest:
    """Write a new version of the model under ``root`` and return its manifest.

    ``factory`` ("module:callable", default the model's class) and ``factory_kwargs`` rebuild
    the module in a server. ``incremental=True`` writes only the tensors that changed since
    ``parent`` (default: the newest complete version); without a parent it writes a full
    snapshot. Usable from a training script at any step: the version appears complete or not
    at all.
    """
    root = Path(root)
    state = _as_state(model)
    check_finite(state, "publish")
    if factory is None:
        if not isinstance(model, torch.nn.Module):
            raise ArtifactError("publishing a bare state_dict needs factory='module:callable'")
        factory = _factory_of(model)
    if ":" not in factory:
        raise ArtifactError(f"factory {factory!r} must look like 'package.module:callable'")
    if input_shape is None:
        if not isinstance(model, torch.nn.Module):
            raise ArtifactError("publishing a bare state_dict needs input_shape=(...)")
        inputs = _infer_input(model)
    else:
        inputs = InputSpec(input_dtype, tuple(int(d) for d in input_shape))
    if inputs.dtype not in ("float32", "int64"):
        raise ArtifactError(f"input_dtype must be 'float32' or 'int64', not {inputs.dtype!r}")
    kwargs = dict(factory_kwargs or {})
    try:  # refuse what a manifest cannot hold, before writing anything
        json.dumps(kwargs)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"factory_kwargs must be plain JSON values: {exc}") from None

    if incremental and parent is None:
        versions = list_versions(root)
        parent = versions[-1] if versions else None
    kind = "full"
    to_write = state
    if incremental and parent is not None:
        base = load_state(root, parent)
        if set(base) != set(state) or any(
            base[k].shape != state[k].shape or base[k].dtype != state[k].dtype for k in state
        ):
            raise ArtifactError(
                f"the model's tensors differ in names, shapes or dtypes from version {parent}: "
                "publish a full version (incremental=False)"
            )
        to_write = {k: t for k, t in state.items() if not torch.equal(t, base[k])}
        kind = "delta"

    vdir = _claim_version_dir(root)
    try:
        file_entry, tensors = _write_dense(vdir, to_write)
    except BaseException:  # a failed write leaves no half version behind (nor a hole in it)
        shutil.rmtree(vdir, ignore_errors=True)
        raise
    manifest = Manifest(
        version=vdir.name,
        kind=kind,
        parent=parent if kind == "delta" else None,
        factory=factory,
        factory_kwargs=kwargs,
        inputs=inputs,
        files=(file_entry,),
        tensors=tensors,
        state_sha256=state_digest(state),
        lineage=lineage or Lineage(),
        created_at=time.time(),
    )
    atomic_write(vdir / MANIFEST, manifest.to_json().encode())  # last: now it is visible
    fsync_dir(root)
    return manifest


# ----------------------------------------------------------------------------- loading


def _read_files(vdir: Path, m: Manifest) -> dict[str, bytearray]:
    """Every data file's bytes, checked against the manifest's size and sha256."""
    out: dict[str, bytearray] = {}
    for fe in m.files:
        path = vdir / fe.path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IntegrityError(f"{path} is missing; republish version {m.version}") from None
        if size != fe.size:
            raise IntegrityError(f"{path}: {size} bytes, the manifest says {fe.size}")
        buf = bytearray(size)
        with open(path, "rb") as f:
            f.readinto(buf)
        digest = hashlib.sha256(buf).hexdigest()
        if digest != fe.sha256:
            raise IntegrityError(
                f"{path}: sha256 {digest[:12]}… does not match the manifest's {fe.sha256[:12]}… "
                f"(corrupt or tampered file); republish version {m.version}"
            )
        out[fe.path] = buf
    return out


def _tensors_of(vdir: Path, m: Manifest) -> dict[str, torch.Tensor]:
    files = _read_files(vdir, m)
    out: dict[str, torch.Tensor] = {}
    for te in m.tensors:
        if te.dtype not in DTYPES:
            raise IntegrityError(f"{vdir}: tensor {te.name!r} has unknown dtype {te.dtype!r}")
        dtype = DTYPES[te.dtype]
        numel = 1
        for d in te.shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        buf = files.get(te.file)
        if buf is None or te.nbytes != numel * itemsize or te.offset + te.nbytes > len(buf):
            raise IntegrityError(
                f"{vdir}: tensor {te.name!r} ({te.dtype}{list(te.shape)}) does not fit "
                f"{te.file} at offset {te.offset}"
            )
        if numel == 0:
            out[te.name] = torch.empty(te.shape, dtype=dtype)
        else:
            flat = torch.frombuffer(buf, dtype=dtype, count=numel, offset=te.offset)
            out[te.name] = flat.reshape(te.shape)
    return out


def load_state(
    root: str | os.PathLike[str],
    version: str,
    base: tuple[str, Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """The full, verified state of ``version`` (a delta resolved through its parents).

    ``base=(version, state)`` is a state already in memory (the one being served): a delta
    whose parent it is is applied on top of it without reading the parent again.
    """
    root = Path(root)
    m = read_manifest(root, version)
    own = _tensors_of(root / version, m)
    if m.kind == "full":
        state = own
    else:
        if m.parent is None:
            raise ArtifactError(f"version {version}: an incremental version needs a parent")
        if base is not None and base[0] == m.parent:
            parent_state: Mapping[str, torch.Tensor] = base[1]
        else:
            parent_state = load_state(root, m.parent)
        unknown = set(own) - set(parent_state)
        if unknown:
            raise IntegrityError(f"version {version}: tensors {sorted(unknown)} not in parent")
        state = {**parent_state, **own}
    check_finite(state, f"version {version}")
    digest = state_digest(state)
    if digest != m.state_sha256:
        raise IntegrityError(
            f"version {version}: resolved state digest {digest[:12]}… differs from the "
            f"manifest's {m.state_sha256[:12]}… (wrong parent or corrupt delta)"
        )
    return state


def _import_factory(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ArtifactError(
            f"cannot import the model factory {path!r} ({exc}); put its module on PYTHONPATH"
        ) from exc
    return obj


def build_model(
    root: str | os.PathLike[str],
    version: str,
    base: tuple[str, Mapping[str, torch.Tensor]] | None = None,
) -> tuple[torch.nn.Module, Manifest, dict[str, torch.Tensor]]:
    """Rebuild the module of ``version`` in eval mode; also its manifest and its state (the
    module's own tensors: a server keeps them as the base for the next delta at no extra
    memory)."""
    m = read_manifest(root, version)
    if m.sparse is not None:
        raise ArtifactError(
            f"version {version} is a sparse model (tables + dense part): build it with "
            "coadapt.serve.sparse_artifacts.build_sparse_model"
        )
    state = load_state(root, version, base)
    module = _import_factory(m.factory)(**m.factory_kwargs)
    if not isinstance(module, torch.nn.Module):
        raise ArtifactError(f"factory {m.factory!r} returned {type(module).__name__}, no Module")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise IntegrityError(f"version {version} does not fit {m.factory}: {exc}") from exc
    module.eval()
    # the module's own tensors (views, no second copy) stand for the state from now on
    return module, m, dict(module.state_dict())
