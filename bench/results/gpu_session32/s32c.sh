# Session 32, call 3 (right after call 2, the machine warm): the default model's GGUF
# joined; the engine's async-scheduling tests on the GPU (the ahead steps' token copy now
# rides in the next step's input launch), the server's, and the stack's real-model check.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mmhome/downloads && cat /tmp/smol.part00 .carry/smol.part01 > /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 && echo "gguf ok"
export MMSERVE_HOME=/tmp/mmhome
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 500 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/engine/test_async_scheduling.py tests/server/test_server_async.py 2>&1 | tail -8
echo "tests $(( $(date +%s) - t0 )) s"
