#!/usr/bin/env bash
# Can GPU time per kernel be had without a code change? Run on a GPU machine (one H100/H200, a
# Python with PyTorch and its CUDA wheels, gcc):
#
#     bash scripts/cupti_check/check.sh [python]        # ~1 minute
#
# It builds inject.c (a CUDA injection library: CUPTI kernel activity records) against the CUPTI of
# PyTorch's wheels, then runs workload.py four times: plain; with CUDA_INJECTION64_PATH set (what a
# pod spec can set, as Parca's GPU support does); both again with torch.profiler on, since
# PyTorch's own profiler also uses CUPTI. It prints, per run, the wall time, the GPU time by CUDA
# events, the kernel records CUPTI gave and their summed duration. What holds up, and what to
# report back (docs/gpu.md, "Kernel time"):
#   - records > 0 with the injection alone: GPU time per kernel without a code change;
#   - their summed duration close to the CUDA-event time (one stream, back to back): the widths
#     would be GPU time;
#   - wall time with the injection against without: its cost;
#   - torch.profiler still working with the injection on (and its kernel count): no conflict.
set -euo pipefail
PY=${1:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
CUPTI=$("$PY" -c 'import nvidia.cuda_cupti as c; print(list(c.__path__)[0])')
LIB=$(ls "$CUPTI"/lib/libcupti.so* | head -1)
echo "CUPTI: $LIB"
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name())'
# cupti.h includes cuda.h: the runtime wheel's headers, else a CUDA toolkit's
RUNTIME=$("$PY" -c 'import nvidia.cuda_runtime as c; print(list(c.__path__)[0])' 2>/dev/null || true)
CUDA_H=$(ls "$RUNTIME"/include/cuda.h /usr/local/cuda/include/cuda.h 2>/dev/null | head -1)
[ -n "$CUDA_H" ] || { echo "no cuda.h: pip install nvidia-cuda-runtime-cu12, or set up a CUDA toolkit" >&2; exit 1; }
gcc -O2 -shared -fPIC -I"$CUPTI/include" -I"$(dirname "$CUDA_H")" ${KERNEL_RECORD:+-DKERNEL_RECORD=$KERNEL_RECORD} \
    -o "$WORK/libcupti_inject.so" "$HERE/inject.c" "$LIB" -Wl,-rpath,"$(dirname "$LIB")"

summary() {  # records and their summed duration in a TSV written by the injection
    "$PY" - "$1" <<'PYEOF'
import collections, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
total = sum(int(r[2]) for r in rows)
names = collections.Counter(r[5] for r in rows)
print(f"  CUPTI: {len(rows)} kernel records, {total / 1e9:.4f} s of GPU time; top kernels:")
for name, count in names.most_common(4):
    print(f"    {count:6d}  {name[:110]}")
PYEOF
}

for profiler in "" "--torch-profiler"; do
    echo "== plain ${profiler}"
    "$PY" "$HERE/workload.py" $profiler
    echo "== CUDA_INJECTION64_PATH ${profiler}"
    OTELBPF_CUPTI_OUT="$WORK/kernels${profiler}.tsv" CUDA_INJECTION64_PATH="$WORK/libcupti_inject.so" \
        "$PY" "$HERE/workload.py" $profiler
    summary "$WORK/kernels${profiler}.tsv"
done
echo "(records include the warm-up's: 5 steps of 200+5; files in $WORK)"
