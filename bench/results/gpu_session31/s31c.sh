# Session 31, start 2: s31c.py (the engine's step against the stack's replay, per setting)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
timeout 400 python3 bench/results/gpu_session31/s31c.py 2>&1 | grep -v Warn | tail -14
