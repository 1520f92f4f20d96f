#!/usr/bin/env python3
"""Run on the GPU machine: make the random Qwen3-0.6B-shaped bf16 model and dump
transformers' last-position logits for prompts of 1..2000 tokens.

Usage: gpu_make_models.py OUT_DIR
Writes OUT_DIR/qwen3-0.6b-random/{config.json, model.safetensors} and
OUT_DIR/qwen3-0.6b-random/reference_logits.json:
  {"prompts": [{"ids": [...], "logits": [151936 floats]}, ...]}
"""
import json
import random
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

PROMPT_LENGTHS = [1, 7, 64, 513, 1024, 2000]


def main() -> None:
    out = Path(sys.argv[1]) / "qwen3-0.6b-random"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1e6,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        bos_token_id=151643,
        eos_token_id=151645,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).cuda().eval()
    model.save_pretrained(out, safe_serialization=True)
    rng = random.Random(1)
    prompts = []
    with torch.no_grad():
        for n in PROMPT_LENGTHS:
            ids = [rng.randrange(0, 10000) for _ in range(n)]
            logits = model(torch.tensor([ids], device="cuda")).logits[0, -1].float().cpu()
            prompts.append({"ids": ids, "logits": logits.tolist()})
            print(f"prompt of {n} tokens: logits max {logits.max():.3f}", flush=True)
    (out / "reference_logits.json").write_text(json.dumps({"prompts": prompts}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
