# Session 25, start 1, second call (right after s25a.sh, the machine warm): the default
# model's GGUF joined from the two carried parts; async scheduling's engine tests on the
# real model (steps launched ahead from the argmax read in place, tokens to the host by
# kernel) and both shapes end to end
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mmhome/downloads && cat /tmp/smol.part00 .carry/smol.part01 > /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 && echo "gguf ok"
export MMSERVE_HOME=/tmp/mmhome
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/engine/test_async_scheduling.py 2>&1 | tail -6 | tee $OUT/tests_async.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 bench/throughput.py --models smollm2-135m llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp 2>&1 | grep -v Warn | tail -9
python3 -c "import json; d=json.load(open('$OUT/tp/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
rm -f $OUT/tp/*.png
echo "all $(( $(date +%s) - t0 )) s"
