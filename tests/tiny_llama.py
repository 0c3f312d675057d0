"""A tiny random Llama on ``tools.policy_sim``'s attention: the CPU reference tools' test model."""

from __future__ import annotations

import torch

from tools.policy_sim import register_attention


def tiny_llama(head_scale: float = 1.0):
    """2 layers, 4 query and 2 KV heads, a 96-token vocabulary, seeded weights; ``head_scale`` multiplies the LM
    head (a large one makes the argmax decisive: no near-ties between numerics of 1- and 9-token forwards)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    cfg._attn_implementation = register_attention()
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model
