"""benchmarks/pollux_arithmetic.py re-runs the 16x4 figure with other CPUs' arithmetic: only the
variants this CPU can execute, and each child really runs the kernels its variant names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.pollux_arithmetic import (
    NUMPY_ABOVE_AVX2,
    VARIANTS,
    cpu_flags,
    numpy_groups,
    runnable,
    variant_env,
)

AVX2_ONLY = {"avx", "avx2", "fma", "sse4_2"}


def test_a_cpu_without_avx512_skips_the_kernels_it_cannot_execute() -> None:
    names = [v[0] for v in runnable(AVX2_ONLY, {"X86_V3"})]
    assert "blas SkylakeX" not in names  # would be an illegal instruction there
    assert "blas Haswell" in names and "blas Sandybridge, numpy <= SSE4" in names
    assert "numpy <= AVX2" not in names  # nothing above AVX2 to disable: same as the first row
    capped = dict((v[0], v[2]) for v in runnable(AVX2_ONLY, {"X86_V3"}))
    assert capped["blas Sandybridge, numpy <= SSE4"] == ("X86_V3",)  # only groups it runs
    assert [v[0] for v in runnable(set(), set())] == [
        v[0] for v in VARIANTS if v[1] is None and not v[2]
    ]


def test_a_variant_clears_what_the_caller_had_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    monkeypatch.setenv("COADAPT_NO_JIT", "1")
    env = variant_env(None, (), False)
    assert "OPENBLAS_CORETYPE" not in env and "COADAPT_NO_JIT" not in env
    env = variant_env("Haswell", NUMPY_ABOVE_AVX2, True)
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["COADAPT_NO_JIT"] == "1"
    assert env["NPY_DISABLE_CPU_FEATURES"] == " ".join(NUMPY_ABOVE_AVX2)


@pytest.mark.skipif(
    not {"avx2", "fma"} <= cpu_flags(), reason="Haswell kernels need AVX2 and FMA (x86-64)"
)
def test_the_child_runs_the_kernels_its_variant_names() -> None:
    groups = numpy_groups()
    disabled = tuple(g for g in NUMPY_ABOVE_AVX2 if g in groups)
    probe = (
        "import json, numpy\n"
        "from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__\n"
        "from threadpoolctl import threadpool_info\n"
        "arch = sorted({i.get('architecture') for i in threadpool_info()"
        " if i.get('internal_api') == 'openblas'})\n"
        "print(json.dumps({'arch': arch,"
        " 'groups': [g for g in __cpu_dispatch__ if __cpu_features__.get(g)]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=variant_env("Haswell", disabled, False),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    seen = json.loads(out.stdout)
    assert seen["arch"] == ["Haswell"]
    assert not set(disabled) & set(seen["groups"])
