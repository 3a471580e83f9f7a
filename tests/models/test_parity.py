"""Greedy token-for-token parity with HF transformers on the same weights (fp32, CPU).

The reference is transformers' own model class loaded from the same converted
directory; ours runs through the paged, batch-invariant engine path.
"""

import pytest
import torch
import transformers

from mmserve.models.harness import SequenceRunner
from mmserve.models.registry import load_model
from mmserve.models.tokenizer import Tokenizer

PROMPTS = ["The capital of France is", "def quicksort(arr):", "Once upon a time, in a land"]


def _hf_greedy(model_dir, ids, n):
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = list(ids)
    with torch.no_grad():  # plain argmax over full forwards: no generate() logits processing
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


@pytest.mark.parametrize("fixture,n", [("default_model_dir", 32), ("gemma_model_dir", 12)])
def test_greedy_parity_with_transformers(request, fixture, n):
    model_dir = request.getfixturevalue(fixture)
    tok = Tokenizer(model_dir)
    model = load_model(model_dir)
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=True)
        want = _hf_greedy(model_dir, ids, n)
        runner = SequenceRunner(model, max_len=256)
        ours = runner.greedy(ids, n)
        assert ours == want, (prompt, tok.decode(ours), tok.decode(want))
