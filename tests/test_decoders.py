"""The sampler's incremental decoders against the model's own full forward: teacher-forced, with
left padding, shared prompts and rows dropped mid-way, on small random models of each family."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from evotrainer.policies.decoders import HFDecoder, KVDecoder, SharedPrefixDecoder, own_decoder_fits
from evotrainer.policies.hf import left_pad, positions

SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=64)


def llama(**kw):
    return LlamaForCausalLM(LlamaConfig(**SMALL, num_attention_heads=4, **kw)).eval()


def qwen2(**kw):
    return Qwen2ForCausalLM(Qwen2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, **kw)).eval()


def lora_llama():
    """An adapted Llama whose adapters change every projection (peft starts lora_B at zero: a no-op)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(llama(num_key_value_heads=2), LoraConfig(r=2, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    return model.eval()


MODELS = {
    "llama": lambda: llama(num_key_value_heads=4),
    "llama-lora": lora_llama,
    "llama-gqa-bias": lambda: llama(num_key_value_heads=2, attention_bias=True),
    "qwen2": qwen2,
}


@pytest.mark.parametrize("decoder", [KVDecoder, SharedPrefixDecoder, HFDecoder])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_decoder_logits_equal_the_full_forward(family, decoder):
    torch.manual_seed(0)
    model = MODELS[family]()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 101, (n,), generator=g).tolist() for n in (5, 9, 2)]
    rows = torch.tensor([0, 1, 1, 2, 0, 2])  # batch row -> prompt: a prompt shared by two rows each
    new = torch.randint(3, 101, (len(rows), 6), generator=g)
    ids, mask = left_pad(prompts, 0)
    pos = positions(mask)
    width = ids.shape[1]
    dec = HFDecoder(model) if decoder is HFDecoder else decoder(model, width + new.shape[1])
    with torch.no_grad():
        got = [dec.prefill(ids, mask, pos, rows)]
        alive, next_pos = torch.arange(len(rows)), pos[rows, -1] + 1
        for t in range(new.shape[1] - 1):
            if t == 2:  # rows 1 and 4 finish: their cache rows leave the batch
                keep = torch.tensor([0, 2, 3, 5])
                dec.select(keep)
                alive, next_pos = alive[keep], next_pos[keep]
            got.append(dec.step(new[alive, t], next_pos))
            next_pos = next_pos + 1
        for row in range(len(rows)):
            # The truth: the row alone, unpadded, through the model's forward without any cache.
            seq = torch.tensor(prompts[rows[row]] + new[row].tolist())[None]
            truth = model(input_ids=seq).logits[0, len(prompts[rows[row]]) - 1 :].float()
            for t, logits in enumerate(got):
                if t <= 2 or row not in (1, 4):
                    r = row if t <= 2 else int((alive == row).nonzero())
                    torch.testing.assert_close(logits[r], truth[t], atol=2e-5, rtol=1e-4)


def test_own_decoder_only_where_it_is_exact():
    from peft import LoraConfig, get_peft_model

    assert own_decoder_fits(llama(num_key_value_heads=4), 64)
    assert own_decoder_fits(qwen2(), 64)
    windowed = qwen2(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert own_decoder_fits(windowed, 16) and not own_decoder_fits(windowed, 17)
    lora = get_peft_model(llama(num_key_value_heads=4), LoraConfig(r=2, target_modules="all-linear"))
    assert own_decoder_fits(lora, 64)  # its adapters sit in the projections the decoder calls
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=101, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert not own_decoder_fits(gpt2, 64)
