# Session 31, start 3: s31d.py (the stack stamped inside the engine step against alone)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
timeout 300 python3 bench/results/gpu_session31/s31d.py 2>&1 | grep -v Warn | tail -12
