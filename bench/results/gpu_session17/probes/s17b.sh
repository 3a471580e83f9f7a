export PYTHONUNBUFFERED=1
t0=$(date +%s)
mkp() {  # name, python replacement code
  rm -rf /tmp/p_$1 && mkdir -p /tmp/p_$1 && cp -r mmserve bench /tmp/p_$1/
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
mkp noparts '[("return tree_sum(subs, BM, NCH)", "return tl.zeros([BM], tl.float32) + 1.0")]'
mkp nonw '[("elif SQ_IN:  # the folded norm", "elif PB < 0:  # the folded norm")]'
mkp nosqout '[("if SQ_OUT:  # the stored", "if PB < 0:  # the stored")]'
run() { (cd $2 && PYTHONPATH=$2 timeout $3 python3 $OLDPWD/.carry/s17probe.py $OUT/probe_$1.json $4 2>&1 | grep -v Warn | tail -8 | sed "s/^/$1: /"); echo "$1 done $(( $(date +%s) - t0 )) s"; }
run base $PWD 200 ""
run noparts /tmp/p_noparts 90 short
run nonw /tmp/p_nonw 90 short
run nosqout /tmp/p_nosqout 90 short
