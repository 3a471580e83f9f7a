# Session 35, call 2 (carry [".carry/smol.part00"]): the default model's GGUF, first half, out of
# the checkout for s34b.sh (run right after, while the machine is warm).
cp .carry/smol.part00 /tmp/smol.part00 && ls -l /tmp/smol.part00
