"""Finding a model's complete versions on disk and what their manifests say.

A version is complete when its manifest exists (the publisher writes it last, atomically), so a
half-written version is invisible here exactly as it is to the servers. Reading a manifest is
reading JSON: no tenant code runs (the gates, which rebuild the model, run elsewhere). The
artifact format stays :mod:`coadapt.serve.artifacts`'s; it is imported on first use so a
controller without registered models never loads torch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from coadapt.registry.store import NewVersion


def complete_versions(root: str) -> list[str]:
    """The complete versions under ``root``, oldest first."""
    from coadapt.serve import artifacts

    return artifacts.list_versions(root)


def is_model_root(root: str) -> bool:
    """Whether ``root`` can be a model's version root: it holds version directories, or
    nothing yet (registering an unrelated directory would plant a LIVE pointer in it)."""
    from coadapt.serve import artifacts

    path = Path(root)
    if any(True for _ in artifacts.version_dirs(path)):
        return True
    return not any(p.name != artifacts.LIVE_FILE for p in path.iterdir())


def describe(root: str, version: str) -> tuple[NewVersion, str | None]:
    """The version's row from its manifest, and why it cannot be used (None: it can)."""
    from coadapt.serve import artifacts

    path = Path(root) / version / artifacts.MANIFEST
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    try:
        m = artifacts.read_manifest(root, version)
    except artifacts.ArtifactError as exc:
        bad = NewVersion(version, "full", None, digest, len(raw), None, None, None, 0.0)
        return bad, str(exc)
    return (
        NewVersion(
            version=version,
            kind=m.kind,
            parent=m.parent,
            manifest_sha256=digest,
            size_bytes=sum(f.size for f in m.files),
            job_id=m.lineage.job_id,
            step=m.lineage.step,
            data_offset=m.lineage.data_offset,
            created_at=m.created_at,
        ),
        None,
    )


def manifest_digest(root: str, version: str) -> str | None:
    """sha256 of the version's manifest bytes now (None: the manifest is gone)."""
    from coadapt.serve import artifacts

    try:
        return hashlib.sha256((Path(root) / version / artifacts.MANIFEST).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def pointer_present(root: str) -> bool:
    """Whether ``root`` has a LIVE pointer (without one, servers serve the newest version)."""
    from coadapt.serve import artifacts

    return (Path(root) / artifacts.LIVE_FILE).is_file()


def pointer(root: str) -> str | None:
    """The version the LIVE pointer names (None: none, or the pointer holds nothing)."""
    from coadapt.serve import artifacts

    return artifacts.live_version(root) if pointer_present(root) else None


def hold(root: str) -> None:
    """Write an empty LIVE pointer: servers serve nothing until a version is promoted (so a
    version published before the registry validated it never serves)."""
    from coadapt.atomicfile import atomic_write
    from coadapt.serve import artifacts

    atomic_write(Path(root) / artifacts.LIVE_FILE, b"\n")


def set_live(root: str, version: str) -> None:
    """Point servers at ``version`` (they hot-swap to it)."""
    from coadapt.serve import artifacts

    artifacts.set_live(root, version)


def remove_files(root: str, version: str) -> None:
    """Delete a version's directory: its manifest first, so a crash half-way leaves an
    invisible (incomplete) directory, never a damaged complete version."""
    import shutil

    from coadapt.serve import artifacts

    vdir = Path(root) / version
    if vdir.is_symlink():  # never follow a link out of the root: drop the link itself
        vdir.unlink()
        return
    (vdir / artifacts.MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(vdir, ignore_errors=True)
