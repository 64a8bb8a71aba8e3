#!/usr/bin/env bash
# The checks that need a machine with a GPU (issues 16 and 19), as one bounded script: run it
# from the repository root on such a machine. It needs python3 with torch (CUDA), numpy,
# scipy, scikit-learn, numba, pyyaml, httpx, rich and prometheus-client; not the controller's
# dependencies (nothing here starts a controller), so the checkout runs from PYTHONPATH
# without `pip install`. Results go to $OUT (default ./out/gpu), each part under its own time
# limit, and each JSON is rewritten as it grows, so a part cut short keeps what it measured.
#
#   1. time to accuracy on the GPU (benchmarks/tta_bench.py --device cuda, one replica per
#      GPU: every workload, the full fixed grid, 3 seeds);
#   2. CTR ranking end to end at 50M rows (benchmarks/serve/ctr.py, one serving worker,
#      rates up to 80 req/s): the serving code on a server-class CPU beside the 2-core VM's;
#   3. one CTR request's stages in process at 50M rows (ctr.py _stages);
#   4. (with AB_ROOT, another checkout's root) that checkout's adaptive job on the same
#      workloads and seeds, beside part 1's: an A/B of an agent change on the GPU, where
#      the 2-core VM cannot show it.
# A part whose limit (TTA_S, CTR_S, STAGES_S, AB_S seconds) is 0 is skipped. Parts run in the
# order 4, 1, 2, 3.
set -uo pipefail
OUT=${OUT:-out/gpu}
TTA_S=${TTA_S:-290}
SEEDS=${SEEDS:-3}
CTR_S=${CTR_S:-230}
STAGES_S=${STAGES_S:-0}
AB_ROOT=${AB_ROOT:-}
AB_S=${AB_S:-60}
mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo
{
    date -u
    nvidia-smi -L
    nproc
    grep -m1 'model name' /proc/cpuinfo
    free -g | head -2
    python3 -c "import sys, torch, numpy, numba; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
    # the compiled probe kernel once (it uses an LLVM intrinsic through numba's internals)
    python3 -c "import numpy as np; from coadapt.sparse.table import EmbeddingTable; t = EmbeddingTable(dim=8); ids = np.arange(1, 1000, dtype=np.uint64); t.lookup_or_insert(ids); print('probe kernel ok', t.lookup(ids).shape)"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ -n "$AB_ROOT" ] && [ "$AB_S" != 0 ]; then
    echo "== 4. the adaptive job of $AB_ROOT on the GPU (limit ${AB_S}s, $SEEDS seeds)"
    PYTHONPATH="$AB_ROOT" timeout "$AB_S" python3 "$AB_ROOT/benchmarks/tta_bench.py" \
        --device cuda --replicas 1 --seeds "$SEEDS" --modes adaptive --skip-overhead \
        --json "$OUT/tta_gpu_ab.json" >"$OUT/tta_gpu_ab.log" 2>&1
    echo "rc=$?"
    tail -n 12 "$OUT/tta_gpu_ab.log"
fi

if [ "$TTA_S" != 0 ]; then
    echo "== 1. time to accuracy on the GPU (limit ${TTA_S}s, $SEEDS seeds)"
    timeout "$TTA_S" python3 benchmarks/tta_bench.py --device cuda --replicas 1 --seeds "$SEEDS" \
        --skip-overhead --json "$OUT/tta_gpu.json" >"$OUT/tta_gpu.log" 2>&1
    echo "rc=$?"
    tail -n 45 "$OUT/tta_gpu.log"
fi

if [ "$CTR_S" != 0 ]; then
    echo "== 2. CTR 200x500 at 50M rows, end to end (limit ${CTR_S}s)"
    timeout "$CTR_S" python3 benchmarks/serve/ctr.py --ctr-rows 50000000 --ctr-rates 10,20,40,80 \
        --ctr-table-shards 0 --ctr-skip freshness --json "$OUT/ctr_50m.json" >"$OUT/ctr_50m.log" 2>&1
    echo "rc=$?"
    tail -n 25 "$OUT/ctr_50m.log"
fi

if [ "$STAGES_S" != 0 ]; then
    echo "== 3. one CTR request's stages in process at 50M rows (limit ${STAGES_S}s)"
    timeout "$STAGES_S" python3 benchmarks/serve/ctr.py _stages --rows 50000000 --iters 200 \
        --pairs 2 --json "$OUT/ctr_stages_50m.json" >"$OUT/ctr_stages_50m.log" 2>&1
    echo "rc=$?"
    tail -n 20 "$OUT/ctr_stages_50m.log"
fi
