"""Makes two random models for `engine bench` (issue 43): a Qwen3-MoE-shaped one (hidden 1024,
8 layers, 16 experts of width 512, 4 per token) and a dense Qwen3 with the same active
parameters per token (FFN width 4 x 512 = 2048), both as F32 GGUF files written as
llama.cpp's converter writes them (the references script's writers), for llama-quantize.

    /tmp/refenv/bin/python scripts/make-moe-bench-models.py OUT_DIR
"""
import importlib.util
import os
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

spec = importlib.util.spec_from_file_location(
    "refs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "make-references.py"))
refs = importlib.util.module_from_spec(spec)
out = sys.argv[1]
sys.argv = sys.argv[:1]
spec.loader.exec_module(refs)
os.makedirs(out, exist_ok=True)


def add_vocab(w, c):
    """The references' vocabulary with one merge (`<0> <1>`, the last token): llama-quantize
    drops an empty merges array, and a BPE vocabulary without one does not load."""
    tokens = [f"<{i}>" for i in range(refs.VOCAB - 1)] + ["<0><1>"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * refs.VOCAB)
    w.add_token_merges(["<0> <1>"])
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)


refs.add_vocab = add_vocab
shape = dict(vocab_size=refs.VOCAB, hidden_size=1024, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=8, head_dim=64,
             max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2)
torch.set_num_threads(2)
for name, cls, cfg in [
    ("moe-16x4", Qwen3MoeForCausalLM,
     Qwen3MoeConfig(**shape, intermediate_size=2048, num_experts=16, num_experts_per_tok=4,
                    moe_intermediate_size=512, norm_topk_prob=True, mlp_only_layers=[])),
    ("dense-active", Qwen3ForCausalLM, Qwen3Config(**shape, intermediate_size=2048)),
]:
    model = cls(cfg).eval()
    refs.randomise(model)
    arch = "qwen3moe" if "moe" in name else "qwen3"
    refs.gguf_writer_for(arch, permute_qk=False)(model, cfg, os.path.join(out, f"{name}.f32.gguf"))
    print("wrote", name, sum(p.numel() for p in model.parameters()), "parameters")
