export PYTHONUNBUFFERED=1
t0=$(date +%s)
mkp() {  # name, python replacement code
  rm -rf /tmp/p_$1 && mkdir -p /tmp/p_$1 && cp -r mmserve bench .carry /tmp/p_$1/
  python3 - /tmp/p_$1/mmserve/kernels/triton_fused.py "$2" <<'P'
import sys
p, code = sys.argv[1], sys.argv[2]
s = open(p).read()
for old, new in eval(code):
    assert s.count(old) == 1, old
    s = s.replace(old, new)
open(p, "w").write(s)
P
}
mkp sumpairs '[("a, b = tl.split(tl.reshape(x, (R, N // 2, 2)))\n        return a + b", "return tl.sum(tl.reshape(x, (R, N // 2, 2)), 2)")]'
mkp noparts '[("        return tree_sum(subs, BM, NCH)\n", "        return tl.zeros([BM], tl.float32) + 1.0\n")]'
run() { (cd $2 && PYTHONPATH=$2 timeout $3 python3 .carry/s17probe2.py $OUT/probe3_$1.json $4 2>&1 | grep -v Warn | tail -8 | sed "s/^/$1: /"); echo "$1 done $(( $(date +%s) - t0 )) s"; }
run main $PWD 240 "fold_pre,fold_pre@8,fold_pre@16,fold_pre@48,fold_pre@40"
run sumpairs /tmp/p_sumpairs 120 "fold_pre,fold_pre@16"
run noparts /tmp/p_noparts 100 "fold_pre"
