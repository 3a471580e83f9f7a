# Session 31, start 3: s31e.py (the engine step per stack setting)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
timeout 300 python3 bench/results/gpu_session31/s31e.py 2>&1 | grep -v Warn | tail -10
