"""Writes ``pre_branch_0005.db``: a database as the release before tuning's own migration
branch left it (controller chain 0001-0005 with the tune tables in 0003, our revision in
``alembic_version``), with a tenant, a job, an experiment, its trials and its Optuna study.

It must run on that release's code, not this one's (the frozen file is the point)::

    mkdir /tmp/old && git archive c07838f coadapt | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old .venv/bin/python tests/tune/data/make_pre_branch_db.py
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna

from coadapt.controller.db import sqlite_url
from coadapt.controller.spec import parse_spec
from coadapt.controller.store import Store
from coadapt.tune.samplers import ask_params, create_study
from coadapt.tune.spec import parse_experiment
from coadapt.tune.store import TrialState, TuneStore, optuna_storage

OUT = Path(__file__).resolve().parent / "pre_branch_0005.db"

SPEC = {
    "name": "old",
    "space": {"lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True}},
    "objective": {"metric": "loss", "direction": "minimize"},
    "trial": {"script": "train.py", "working_dir": "/tmp"},
    "max_trials": 8,
    "sampler": "tpe",
    "seed": 1,
}


def main() -> None:
    OUT.unlink(missing_ok=True)
    url = sqlite_url(OUT)
    store = Store.open(url)
    tenant, _ = store.create_tenant("alice", 1.0)
    store.create_job(
        tenant, parse_spec({"name": "j", "script": "train.py", "working_dir": "/tmp"}), now=1.0
    )
    tune = TuneStore(store)
    spec = parse_experiment(SPEC)
    exp = tune.create_experiment(tenant, "old", spec.model_dump(mode="json"), now=2.0)
    db = optuna_storage(url)
    study = create_study(db, exp.study_name, spec)
    for value in (0.5, 0.25):
        trial, params = ask_params(study, spec)
        tune.add_trial(exp.id, trial.number, params, now=3.0)
        study.tell(trial, value)
        tune.update_trial(
            tune.trial(exp.id, trial.number).id, state=TrialState.SUCCEEDED, value=value
        )
    trial, params = ask_params(study, spec)  # still running when the release is replaced
    tune.add_trial(exp.id, trial.number, params, now=4.0)
    tune.update_experiment(exp.id, 5.0, best_value=0.25, best_trial=1)
    db.engine.dispose()
    store.close()
    conn = sqlite3.connect(OUT)
    conn.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
    conn.execute("VACUUM")
    conn.close()
    print(f"wrote {OUT} with optuna {optuna.__version__}")


if __name__ == "__main__":
    main()
