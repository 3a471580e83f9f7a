"""Connector training on tiny random models (a 2-layer Llama with the default model's
tokenizer, a 1-block ViT): only the projector learns, the loss is HF's own loss on the
caption tokens, and a resumed run ends where an uninterrupted one does."""

from dataclasses import replace

import pytest
import torch

from connectors.encoder import (
    EncoderSpec,
    Preprocess,
    TimmEncoder,
    create_encoder_model,
    data_config,
)
from connectors.projector import Projector, ProjectorSpec
from connectors.timm_connector import ConnectorConfig, load_connector
from connectors.train import PrefixKV, TrainConfig, Trainer

SPEC = EncoderSpec(
    "vit_tiny_patch16_224",
    dict(
        img_size=64,
        patch_size=16,
        embed_dim=32,
        depth=1,
        num_heads=2,
        class_token=False,
        global_pool="avg",
    ),
    None,
    dict(input_size=(3, 64, 64), crop_pct=1.0, crop_mode="squash"),
)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from mmserve.models.tokenizer import Tokenizer

    return Tokenizer(default_model_dir)


def _lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).eval()


def _trainer(tmp_path, tokenizer, steps=3, lm=None):
    torch.manual_seed(1)
    model = create_encoder_model(SPEC)
    cfg = ConnectorConfig(SPEC, ProjectorSpec("shuffle_mlp", 32, 64, 2), (4, 4), lm="tiny")
    tcfg = TrainConfig(
        str(tmp_path),
        "synthetic:12",
        steps=steps,
        batch_size=4,
        lr=1e-2,
        warmup=1,
        save_every=1,
        val_examples=4,
    )
    trainer = Trainer(
        tcfg,
        cfg,
        TimmEncoder(model),
        Projector(cfg.projector),
        lm or _lm(),
        tokenizer,
        torch.device("cpu"),
        progress=False,
    )
    return trainer, Preprocess(data_config(model, SPEC))


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_only_the_projector_learns(tmp_path, tokenizer):
    trainer, pre = _trainer(tmp_path, tokenizer)
    lm0, enc0, proj0 = _state(trainer.lm), _state(trainer.encoder), _state(trainer.projector)
    trainer.save(trainer.run(trainer.features(pre)))
    for module, before in ((trainer.lm, lm0), (trainer.encoder, enc0)):
        assert all(p.grad is None for p in module.parameters())
        after = module.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)
    after = trainer.projector.state_dict()
    assert any(not torch.equal(proj0[k], after[k]) for k in proj0)
    # the saved directory loads as a servable connector with the same weights
    conn = load_connector(tmp_path, tokenizer, torch.device("cpu"), torch.float32)
    assert all(
        torch.equal(after[k].bfloat16().float(), v)  # stored as bf16
        for k, v in conn.projector.state_dict().items()
    )
    assert conn.processor.tokens(1).num_embeddings == 4


def test_loss_is_hf_loss_on_caption_tokens(tmp_path, tokenizer):
    trainer, pre = _trainer(tmp_path, tokenizer)
    feats = trainer.features(pre)
    idx = [0, 3, 5]
    embed = trainer.lm.get_input_embeddings()
    with torch.no_grad():
        ours = trainer.loss(
            feats, idx, 0, PrefixKV(trainer.lm, trainer.layouts[0].prefix, trainer.device), embed
        )
        # reference: HF's own loss over each whole sequence, labels only on the caption
        seqs, targets = trainer._sequences(idx, 0)
        image = trainer.projector(feats[idx].float())
        total, count = 0.0, 0
        for b, (s, t) in enumerate(zip(seqs, targets, strict=True)):
            prefix = trainer.layouts[0].prefix
            x = torch.cat([embed(torch.tensor(prefix)), image[b], embed(torch.tensor(s))])
            labels = torch.full((x.shape[0],), -100)
            labels[-len(t) :] = torch.tensor(t)
            out = trainer.lm(inputs_embeds=x[None], labels=labels[None])
            total, count = total + float(out.loss) * len(t), count + len(t)
    assert float(ours) == pytest.approx(total / count, rel=1e-4)


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, tokenizer):
    lm = _lm()
    whole, pre = _trainer(tmp_path / "whole", tokenizer, steps=4, lm=lm)
    whole.run(whole.features(pre))
    first, pre = _trainer(tmp_path / "cut", tokenizer, steps=4, lm=lm)
    first.run(first.features(pre), stop_after=2)  # as if killed after step 2
    second, pre = _trainer(tmp_path / "cut", tokenizer, steps=4, lm=lm)
    encoded: list[int] = []  # rows through the encoder: the 4 held-out images only
    forward = second.encoder.forward
    second.encoder.forward = lambda x: encoded.append(len(x)) or forward(x)  # type: ignore
    feats = second.features(pre)  # the 12 training images' features come from the cache
    assert encoded == [4] and (tmp_path / "cut" / "features.safetensors").is_file()
    assert torch.equal(feats, whole.features(pre))
    result = second.run(feats)
    assert result.resumed_from == 2
    a, b = whole.projector.state_dict(), second.projector.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    other = replace(second.cfg, lr=0.5)
    with pytest.raises(ValueError, match="other settings"):
        Trainer(
            other,
            second.connector,
            second.encoder,
            Projector(second.connector.projector),
            lm,
            tokenizer,
            torch.device("cpu"),
            progress=False,
        ).run(second.features(pre))
