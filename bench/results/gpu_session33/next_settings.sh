# For the next session (not run in session 33): the attention settings that spilled at the
# register cap before, on the serial kernel with the relaxed wait, which compiles to 0 B
# spilled with each of them (sm_90 compile check, session 33): keys and values a block ahead
# (att_prefetch 2, both of a 129-256-token context's blocks in flight; session 30's lead 2
# priced that at ~-9 us), k_t, v_l1, late_rstd, k_t with v_l1; the engine's batch-1 step
# (step_ab.py, 3 rounds). The spread kernel (the 512 column) still spills with them (att_prefetch
# 2: 124 B, k_t 76 B against 40 B), so a gain at 128 and a loss at 512 means a per-kernel setting.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 400 python3 bench/step_ab.py --out $OUT/step_ab_settings.json --rounds 3 \
  --variant 'pf2={"att_prefetch": 2}' --variant 'kt={"k_t": true}' --variant 'vl1={"v_l1": true}' \
  --variant 'late={"late_rstd": true}' --variant 'ktvl1={"k_t": true, "v_l1": true}' 2>&1 | grep -v Warn | tail -7
echo "step_ab $(( $(date +%s) - t0 )) s"
