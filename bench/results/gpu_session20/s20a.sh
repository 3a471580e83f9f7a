# Session 20, start 1: where the stack's batch-1 step goes (all-program phase clocks; ncu
# source counters of one launch at 250 cached tokens)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 python3 bench/stack_profile.py --ctx 120 250 600 --out $OUT/profile.json 2>&1 | grep -v Warn | tail -30
echo "profile $(( $(date +%s) - t0 )) s"
timeout 240 ncu --clock-control none -k regex:decode_stack --launch-skip 3 --launch-count 1 \
  --import-source yes --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  -o $OUT/stack -f python3 bench/stack_profile.py --launches-only --ctx 250 > $OUT/ncu.log 2>&1
tail -4 $OUT/ncu.log
ncu -i $OUT/stack.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2> $OUT/sass.err
ncu -i $OUT/stack.ncu-rep --page source --csv --print-source cuda > $OUT/lines.csv 2> $OUT/lines.err
ncu -i $OUT/stack.ncu-rep --page details --csv > $OUT/details.csv 2>&1
ls -la $OUT; head -c 600 $OUT/lines.csv; cat $OUT/lines.err | head -5
echo "ncu $(( $(date +%s) - t0 )) s"
