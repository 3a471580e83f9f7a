"""Tiny random-weight VLM checkpoints, written by HF transformers' own classes.

Each builder saves a model (``save_pretrained`` of the HF ``...ForConditionalGeneration``)
and its processor into a directory, the layout a hub checkpoint has, so mmserve and HF load
the same files. The tokenizer is the real SmolLM2 one (the default model's) with the
family's image tokens added; the shapes are small but every architectural switch the
loaders read is set the way the real checkpoints set it.
"""

from __future__ import annotations

from pathlib import Path

import torch

IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]
# the chat templates the real checkpoints ship (SmolVLM's; LLaVA-1.5's; a ChatML one as the
# Qwen2-based LLaVAs use)
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<image>\n' }}{% else %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _tokenizer(src: Path, extra: list[str], bos: bool = False):
    """SmolLM2's tokenizer plus ``extra`` special tokens; ``bos``: it prepends a BOS when
    asked for special tokens, as Llama's tokenizers do (and SmolLM2's does not)."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    tok.add_special_tokens({"additional_special_tokens": extra})
    if bos:
        first = tok.convert_ids_to_tokens(0)
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{first} $A", pair=f"{first} $A {first} $B", special_tokens=[(first, 0)]
        )
    return tok


def _text(vocab: int, **over) -> dict:
    return (
        dict(
            model_type="llama",
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=vocab,
            max_position_embeddings=1024,
        )
        | over
    )


def _spread(model) -> None:
    """Weights that make greedy decoding wander over the vocabulary. HF's 0.02 init gives a
    tiny model near-uniform logits; plain wide weights give "hub" rows that win every argmax
    and a tied head that echoes its input token. So: every token row of one norm (small in
    the embedding, so the layers outweigh the input token in the residual)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 if "position" in name else p.shape[-1] ** -0.5)
                if "embed_tokens" in name or "lm_head" in name:
                    norm = 1.0 if "embed_tokens" in name else p.shape[1] ** 0.5
                    p.mul_(norm / p.norm(dim=1, keepdim=True))
            elif name.endswith("bias") or "class_embedding" in name:
                p.normal_(0.0, 0.1)
            else:  # norm gains
                p.uniform_(0.5, 1.5)


def _save(model, processor, out: Path) -> Path:
    _spread(model)
    model.eval().save_pretrained(out)
    processor.save_pretrained(out)
    return out


def build_idefics3(tokenizer_src: Path, out: Path) -> Path:
    """Idefics3 with a Llama LM: 8x8 patches a 32px tile, scale 2 -> 16 tokens a frame."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    tok = _tokenizer(tokenizer_src, IDEFICS3_TOKENS)
    torch.manual_seed(1)
    cfg = Idefics3Config(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=4,
        ),
        text_config=_text(len(tok)),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    images = Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(
        images,
        tok,
        image_seq_len=16,
        chat_template=SMOLVLM_TEMPLATE.replace("| capitalize", ".capitalize()"),
    )
    return _save(Idefics3ForConditionalGeneration(cfg), processor, out)


def build_smolvlm(tokenizer_src: Path, out: Path) -> Path:
    """SmolVLM with a SmolLM2-shaped LM (tied embeddings): scale 4, up to 3x3 tiles."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    tok = _tokenizer(tokenizer_src, IDEFICS3_TOKENS)
    torch.manual_seed(2)
    cfg = SmolVLMConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=2,
        ),
        text_config=_text(
            len(tok),
            num_key_value_heads=4,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        ),
        scale_factor=4,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
    )
    images = SmolVLMImageProcessor(size={"longest_edge": 96}, max_image_size={"longest_edge": 32})
    processor = SmolVLMProcessor(
        images, tok, SmolVLMVideoProcessor(), image_seq_len=16, chat_template=SMOLVLM_TEMPLATE
    )
    return _save(SmolVLMForConditionalGeneration(cfg), processor, out)


def build_llava_clip(tokenizer_src: Path, out: Path, lm: str = "llama") -> Path:
    """LLaVA-1.5: CLIP tower read at layer -2 without its class token, a Llama (or
    ``lm``: Mistral) LM, a tokenizer that adds BOS (its template writes none)."""
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = _tokenizer(tokenizer_src, ["<image>"], bos=True)
    torch.manual_seed(3)
    cfg = LlavaConfig(
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=28,
            patch_size=4,
            projection_dim=32,
        ),
        text_config=_text(len(tok), model_type=lm, **_LM_EXTRA.get(lm, {})),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=49,
    )
    images = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(
        images,
        tok,
        patch_size=4,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE,
    )
    return _save(LlavaForConditionalGeneration(cfg), processor, out)


def build_llava_siglip_qwen2(tokenizer_src: Path, out: Path) -> Path:
    """LLaVA with a SigLIP tower (last layer, every position) and a Qwen2 LM (QKV bias,
    tied embeddings)."""
    from transformers import (
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessor,
    )

    tok = _tokenizer(tokenizer_src, ["<image>"])
    torch.manual_seed(4)
    cfg = LlavaConfig(
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=32,
            intermediate_size=56,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=4,
        ),
        text_config=_text(
            len(tok), model_type="qwen2", tie_word_embeddings=True, rope_theta=1000000.0
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        image_seq_length=64,
    )
    images = SiglipImageProcessor(size={"height": 32, "width": 32})
    processor = LlavaProcessor(
        images,
        tok,
        patch_size=4,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=0,
        chat_template=CHATML_TEMPLATE,
    )
    return _save(LlavaForConditionalGeneration(cfg), processor, out)


_LM_EXTRA = {"mistral": dict(sliding_window=None)}  # as test_llama_family's Mistral


def build_llava_clip_mistral(tokenizer_src: Path, out: Path) -> Path:
    """LLaVA-1.5's layout with a Mistral LM (as llava-v1.6-mistral's text side)."""
    return build_llava_clip(tokenizer_src, out, lm="mistral")


BUILDERS = {
    "idefics3": build_idefics3,
    "smolvlm": build_smolvlm,
    "llava_clip": build_llava_clip,
    "llava_clip_mistral": build_llava_clip_mistral,
    "llava_siglip_qwen2": build_llava_siglip_qwen2,
}
