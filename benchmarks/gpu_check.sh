#!/usr/bin/env bash
# On the GPU machine, from the repo root: the Triton kernel tests, the matmul invariance/cost
# measurement and the throughput benchmark. Logs and JSON go to $OUT (default bench_out).
#   bash benchmarks/gpu_check.sh [tests] [invariance] [throughput ARGS...]   (no stage: all three)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
if [ -f .tcache/tcache.tgz ]; then  # Triton's compile cache from an earlier call, if carried
  mkdir -p ~/.triton && tar xzf .tcache/tcache.tgz -C ~/.triton
fi
[ $# -eq 0 ] && set -- tests invariance throughput
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv
rc=0
while [ $# -gt 0 ]; do
  stage=$1; shift
  case $stage in
    tests)
      python -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
        tests/kernels/test_triton_*.py tests/bench 2>&1 | tee "$OUT/tests.log" || rc=1 ;;
    invariance)
      python benchmarks/invariance.py "$OUT/invariance.json" 2>&1 | tee "$OUT/invariance.log" || rc=1 ;;
    throughput)
      args=()
      while [ $# -gt 0 ] && [ "$1" != tests ] && [ "$1" != invariance ]; do args+=("$1"); shift; done
      python benchmarks/throughput.py --out-dir "$OUT" "${args[@]}" 2>&1 | tee "$OUT/throughput.log" \
        || rc=1 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
tar czf "$OUT/tcache.tgz" -C ~/.triton cache 2>/dev/null || true
exit $rc
