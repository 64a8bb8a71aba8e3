"""Workloads: the jobs a simulation replays, parsed and validated from CSV.

The format is the Pollux artifact's, ``name,time,application,num_replicas,batch_size``: a job's
name, its submission time in seconds, the traced application it runs and its static
configuration (used by Tiresias/FIFO for GPUs and batch, by Optimus for the batch; Pollux
ignores both). Every error names the file, line and value at fault and the accepted forms.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from coadapt.sim.applications import APPLICATION_NAMES, get_application
from coadapt.sim.errors import SimInputError

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")

#: The artifact's relative job loads (OSDI'21 Fig. 8a): 80, 160, 240 and 320 jobs per trace.
JOB_LOADS = ("0.5", "1.0", "1.5", "2.0")


def bundled_name(index: int | str, load: str = "1.0") -> str:
    """``pollux-3`` at the 1.0x load the paper's tables use, ``pollux-3@1.5`` at another."""
    return f"pollux-{index}" if load == "1.0" else f"pollux-{index}@{load}"


#: Workloads shipped with the package: the artifact's eight traces at each job load, 1.0x first.
BUNDLED_WORKLOADS: dict[str, str] = {
    bundled_name(i, load): (
        f"workload-{i}.csv" if load == "1.0" else f"load-{load}/workload-{i}.csv"
    )
    for load in sorted(JOB_LOADS, key=lambda load: load != "1.0")
    for i in range(1, 9)
}
#: How the bundled names read, for help texts and errors.
BUNDLED_HELP = "pollux-1 .. pollux-8 (1.0x job load), " + ", ".join(
    bundled_name("N", load) for load in JOB_LOADS if load != "1.0"
)


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload, as submitted."""

    name: str
    submit_time: float  # seconds from the start of the simulation
    application: str
    num_replicas: int  # GPUs the user asked for
    batch_size: int  # total batch the user asked for


@dataclass(frozen=True)
class Workload:
    """A named list of jobs in submission order (stable by time, then file order)."""

    name: str
    jobs: tuple[WorkloadJob, ...]


def _parse_int(text: str, where: str, column: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise SimInputError(
            f"{where}: {column} {text!r} is not an integer; accepted: a whole number >= {minimum}"
        ) from None
    if value < minimum:
        raise SimInputError(f"{where}: {column} {value} is below {minimum}; accepted: >= {minimum}")
    return value


def parse_workload(text: str, source: str, name: str | None = None) -> Workload:
    """Parse and validate workload CSV ``text``; ``source`` names it in error messages."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise SimInputError(
            f"{source}:1: empty workload; accepted: a CSV with header {','.join(COLUMNS)}"
        ) from None
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise SimInputError(
            f"{source}:1: header {','.join(header)!r} lacks {', '.join(missing)}; "
            f"accepted: a CSV with header {','.join(COLUMNS)}"
        )
    index = {c: header.index(c) for c in COLUMNS}
    jobs: list[WorkloadJob] = []
    seen: set[str] = set()
    for row in reader:
        where = f"{source}:{reader.line_num}"
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise SimInputError(
                f"{where}: row {','.join(row)!r} has {len(row)} fields, expected {len(header)}; "
                f"accepted: {','.join(COLUMNS)}"
            )
        job_name = row[index["name"]].strip()
        if not job_name:
            raise SimInputError(f"{where}: empty job name; accepted: a unique non-empty name")
        if job_name in seen:
            raise SimInputError(f"{where}: duplicate job name {job_name!r}; accepted: unique names")
        seen.add(job_name)
        time_text = row[index["time"]].strip()
        try:
            submit = float(time_text)
        except ValueError:
            submit = math.nan
        if not math.isfinite(submit) or submit < 0:
            raise SimInputError(
                f"{where}: time {time_text!r} is invalid; accepted: seconds >= 0 (a number)"
            )
        app_name = row[index["application"]].strip()
        if app_name not in APPLICATION_NAMES:
            raise SimInputError(
                f"{where}: unknown application {app_name!r}; accepted: "
                f"{', '.join(APPLICATION_NAMES)}"
            )
        replicas = _parse_int(row[index["num_replicas"]], where, "num_replicas", 1)
        batch = _parse_int(row[index["batch_size"]], where, "batch_size", 1)
        app = get_application(app_name)
        if not app.init_batch_size <= batch <= app.max_batch_size:
            raise SimInputError(
                f"{where}: batch_size {batch} is outside the traces of {app_name}; accepted: "
                f"{app.init_batch_size}..{app.max_batch_size}"
            )
        jobs.append(WorkloadJob(job_name, submit, app_name, replicas, batch))
    if not jobs:
        raise SimInputError(f"{source}: no jobs; accepted: at least one row after the header")
    ordered = sorted(jobs, key=lambda j: j.submit_time)
    return Workload(name or Path(source).stem, tuple(ordered))


def load_workload(spec: str) -> Workload:
    """A bundled workload by name (``pollux-1`` .. ``pollux-8`` at 1.0x load, ``pollux-1@0.5``
    .. ``pollux-8@2.0`` at the others) or a CSV file by path."""
    if spec in BUNDLED_WORKLOADS:
        ref = resources.files("coadapt.sim").joinpath("data").joinpath("workloads")
        for part in BUNDLED_WORKLOADS[spec].split("/"):
            ref = ref.joinpath(part)
        text = ref.read_text(encoding="utf-8")
        return parse_workload(text, BUNDLED_WORKLOADS[spec], name=spec)
    path = Path(spec)
    if not path.is_file():
        raise SimInputError(
            f"{spec}: no such workload; accepted: a CSV file path or a bundled name "
            f"({BUNDLED_HELP})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SimInputError(
            f"{spec}: cannot read workload ({exc}); accepted: a UTF-8 CSV file"
        ) from exc
    return parse_workload(text, str(path))
