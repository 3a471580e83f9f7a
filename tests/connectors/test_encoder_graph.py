"""The shipped connector's encoder as a CUDA graph: a replayed chunk gives the eager
chunk's rows bit for bit, for any number of images (padded chunks, several chunks)."""

import pytest
import torch

from connectors import synthetic
from connectors.loader import DEFAULT_DIR, load_connector

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _Tok:
    """The processor asks the tokenizer for its placeholder and separator ids only."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [7] if text else []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_graph_replay_equals_eager(dtype):
    conn = load_connector(DEFAULT_DIR, _Tok(), torch.device("cuda"), dtype)
    images = [synthetic.sample("test", 500 + i)[0] for i in range(37)]
    pixels = [conn.processor.prepare(im).pixels for im in images]
    eager = {n: conn.encode(pixels[:n]) for n in (1, 5, 16, 17, 37)}
    assert conn._graph is None
    conn.warm_up()
    assert conn._graph is not None, "warm-up on CUDA captures the encoder graph"
    for n, want in eager.items():
        got = conn.encode(pixels[:n])
        assert len(got) == n
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g, w), f"{n} images: replayed rows differ from eager"
    # the rows outlive the next replay (each chunk's output is copied out)
    first = conn.encode(pixels[:1])[0].clone()
    conn.encode(pixels[20:36])
    assert torch.equal(conn.encode(pixels[:1])[0], first)
