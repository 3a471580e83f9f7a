"""Session 19 probe: throughput.py with 64-key attention splits (other bits than the
default's 128; the serial-graph threshold follows, 2 splits = 128 keys)."""
import sys

sys.path.insert(0, "bench")
from mmserve.engine import cuda_graphs  # noqa: E402
from mmserve.kernels import triton_attention, triton_decode_stack, triton_rope_attention  # noqa: E402

for mod in (triton_attention, triton_decode_stack, triton_rope_attention, cuda_graphs):
    mod.SPLIT = 64
cuda_graphs.SERIAL_MAX_KEYS = 128
import throughput  # noqa: E402

sys.argv = ["throughput.py", *sys.argv[1:]]
throughput.run_throughput(throughput.parse())
