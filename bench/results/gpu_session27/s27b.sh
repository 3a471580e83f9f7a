# Session 27, start 1, second call: the default model's GGUF joined; SmolLM2-135M batch 1
# and 64 and a 2,048-token prefill with the new fused norm (and the stack's hand-over)
# against session 26's code (HEAD 8219a6e, carried in .carry/old), alternated.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mmhome/downloads && cat /tmp/smol.part00 .carry/smol.part01 > /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 && echo "gguf ok"
export MMSERVE_HOME=/tmp/mmhome
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
for r in 1 2; do
for v in new old; do
  if [ $v = new ]; then P=$PWD; else P=$PWD/.carry/old; fi
  PYTHONPATH=$P:/tmp/site timeout 130 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp_${v}_$r 2>&1 | grep -v Warn | tail -4
  echo "$v $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
