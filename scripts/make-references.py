"""Makes the tiny random models of the model families and their references with transformers:
engine/tests/fixtures/families/<name>/ holds config.json, model.safetensors (f32), a GGUF copy
written with PyPI gguf under the tensor names and metadata keys llama.cpp's converter uses for
the family (model.gguf, where llama.cpp has the family), and
reference.json (top-20 logits at the last prompt position, logits of ids 0..63 at three
positions, 24 greedy tokens and their margins, for five prompts), in the format of
../shared/golden (see its README).

Needs torch, transformers and gguf (CI does not run it: torch is not installed there):
    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch transformers gguf
    /tmp/refenv/bin/python scripts/make-references.py [NAME ...]
(names pick some of the models; none makes them all).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

import gguf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine", "tests", "fixtures",
                   "families")
VOCAB = 256
LENGTHS = [1, 7, 33, 60, 90]
GREEDY_STEPS = 24
MIN_MARGIN = 1e-3

SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2)


def randomise(model):
    """As ../shared/golden's tiny models: linear and embedding weights times 8 (logits spread,
    greedy moves between tokens), every RMSNorm weight uniform in [0.5, 1.5]."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.02)
                p.mul_(8.0)


def reference(model, seed, vocab):
    """The five cases; the input seed is the first from `seed` whose every greedy margin is
    at least MIN_MARGIN (so an exact f32 engine must reproduce every token)."""
    for attempt in range(seed, seed + 50):
        g = torch.Generator().manual_seed(attempt)
        cases = []
        for n in LENGTHS:
            ids = torch.randint(0, min(vocab, VOCAB), (1, n), generator=g)
            with torch.no_grad():
                logits = model(ids).logits[0]
            last = logits[-1]
            top = torch.topk(last, 20)
            positions = [0, n // 2, n - 1]
            greedy, margins = [], []
            seq = ids
            with torch.no_grad():
                out = model(seq, use_cache=True)
                for _ in range(GREEDY_STEPS):
                    step = out.logits[0, -1]
                    tok = int(torch.argmax(step))
                    others = step.clone()
                    others[tok] = -float("inf")
                    margins.append(float(step[tok] - others.max()))
                    greedy.append(tok)
                    out = model(torch.tensor([[tok]]), past_key_values=out.past_key_values,
                                use_cache=True)
            cases.append({
                "n_input": n,
                "input_ids": ids[0].tolist(),
                "last_top20": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
                "first64_positions": positions,
                "first64_logits": [logits[p, :64].tolist() for p in positions],
                "greedy_ids": greedy,
                "greedy_margins": margins,
            })
        if min(m for c in cases for m in c["greedy_margins"]) >= MIN_MARGIN:
            return attempt, cases
    sys.exit("no input seed gave greedy margins above the threshold")


def add_shape(w, c):
    """The keys every family's file has: context, widths, layer and head counts, epsilon."""
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)


def add_vocab(w, c):
    """A byte-level BPE vocabulary of VOCAB tokens `<i>` without merges, BOS and EOS."""
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<{i}>" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([])
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)


def close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_writer_for(arch, permute_qk):
    """A writer of an `arch` GGUF file as llama.cpp's converter writes one: f32 tensors under
    its names (q/k rows permuted to its interleaved RoPE order for `llama`), the RoPE
    scaling keys, and a vocabulary of VOCAB tokens."""
    def write(model, config, path):
        c = config
        w = gguf.GGUFWriter(path, arch)
        rope = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta}
        add_shape(w, c)
        w.add_rope_dimension_count(c.head_dim)
        w.add_rope_freq_base(rope["rope_theta"])
        if rope.get("rope_type") == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(rope["factor"])
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
        add_vocab(w, c)
        sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

        def permute(t, heads):
            if not permute_qk:
                return t
            return (t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:])
                    .swapaxes(1, 2).reshape(t.shape))

        w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
        w.add_tensor("output_norm.weight", sd["model.norm.weight"])
        if "lm_head.weight" in sd and not c.tie_word_embeddings:
            w.add_tensor("output.weight", sd["lm_head.weight"])
        names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                 "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp"}
        for i in range(c.num_hidden_layers):
            for hf, gg in names.items():
                for part in ("weight", "bias"):
                    key = f"model.layers.{i}.{hf}.{part}"
                    if key not in sd:
                        continue
                    t = sd[key]
                    if gg == "attn_q":
                        t = permute(t, c.num_attention_heads)
                    elif gg == "attn_k":
                        t = permute(t, c.num_key_value_heads)
                    w.add_tensor(f"blk.{i}.{gg}.{part}", np.ascontiguousarray(t))
            add_experts(w, sd, c, i)
        close(w)
    return write


def add_experts(w, sd, c, i):
    """Layer i's experts as llama.cpp's converter stacks them: ffn_{gate,up,down}_exps of
    numpy shape [experts, rows, cols] (ggml's ne reversed), from transformers 5's fused
    in-memory gate_up_proj [experts, 2 x width, hidden] (gate rows first) and down_proj;
    the expert keys on the first expert layer."""
    gate_up = sd.get(f"model.layers.{i}.mlp.experts.gate_up_proj")
    if gate_up is None:
        return
    width = gate_up.shape[1] // 2
    if "qwen3moe.expert_count" not in w.kv_data[0]:
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        # llama.cpp renormalises qwen3moe's chosen experts always; the engine reads this key
        # (which llama.cpp's converter writes for other families) when a file has it.
        if not c.norm_topk_prob:
            w.add_expert_weights_norm(False)
    for name, t in [("ffn_gate_exps", gate_up[:, :width]), ("ffn_up_exps", gate_up[:, width:]),
                    ("ffn_down_exps", sd[f"model.layers.{i}.mlp.experts.down_proj"])]:
        w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))


def phi3_gguf_writer(model, config, path):
    """A `phi3` GGUF file as llama.cpp's converter (`Phi3MiniModel`) writes one: q/k/v in
    `attn_qkv` and gate/up in `ffn_up` as stored, the rotated dimensions as the RoPE
    dimension count, LongRoPE's lists as the `rope_factors_long/short` tensors with the
    original context and the attention factor as keys, and the window (0 for none)."""
    c = config
    rope = c.rope_parameters
    w = gguf.GGUFWriter(path, "phi3")
    orig = rope.get("original_max_position_embeddings", c.original_max_position_embeddings)
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * c.hidden_size) // c.num_attention_heads
    add_shape(w, c)
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_sliding_window(c.sliding_window or 0)
    longrope = "long_factor" in rope
    if longrope:
        scale = c.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig))
                                        if scale > 1.0 else 1.0)
    add_vocab(w, c)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    if longrope:
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight",
                     np.array(rope["short_factor"], dtype=np.float32))
    names = {"self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
             "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(c.num_hidden_layers):
        for hf, gg in names.items():
            w.add_tensor(f"blk.{i}.{gg}.weight",
                         np.ascontiguousarray(sd[f"model.layers.{i}.{hf}.weight"]))
    close(w)


def gemma_gguf_writer(arch):
    """A `gemma2` / `gemma3` GGUF file as llama.cpp's converter writes one: every norm
    weight shifted by 1 (Gemma's RMSNorm multiplies by 1 + w), Gemma's norm names
    (`post_attention_norm`, `ffn_norm` before the FFN, `post_ffw_norm`), the global layers'
    RoPE base (the sliding layers' is llama.cpp's default, 10,000), the window and the
    soft-caps; no per-layer pattern (llama.cpp's default: Gemma 2 alternates, Gemma 3 has
    five sliding layers to a global one)."""
    def write(model, config, path):
        c = config
        w = gguf.GGUFWriter(path, arch)
        rope = c.rope_parameters
        add_shape(w, c)
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
        w.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
        w.add_sliding_window(c.sliding_window)
        if getattr(c, "attn_logit_softcapping", None):
            w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        if getattr(c, "final_logit_softcapping", None):
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        add_vocab(w, c)
        sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
        shift = lambda k, t: t + 1.0 if k.endswith("norm.weight") else t
        w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
        w.add_tensor("output_norm.weight", shift("norm.weight", sd["model.norm.weight"]))
        names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                 "post_attention_layernorm": "post_attention_norm",
                 "pre_feedforward_layernorm": "ffn_norm",
                 "post_feedforward_layernorm": "post_ffw_norm"}
        for i in range(c.num_hidden_layers):
            for hf, gg in names.items():
                key = f"model.layers.{i}.{hf}.weight"
                if key in sd:
                    w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(shift(key, sd[key])))
        close(w)
    return write


# The llama.cpp of the PyPI llama-cpp-python sdist (../shared/peers/build-llama-cpp.sh unpacks
# it there), whose converter writes the GGUFs of the families it knows that ours does not.
LLAMA_CPP = os.environ.get("LLAMA_CPP_DIR", os.path.expanduser(
    "~/.cache/peers/sd/llama_cpp_python-0.3.36/vendor/llama.cpp"))


def llama_cpp_converter(model, config, path, outtype="f32"):
    """The GGUF llama.cpp's own `convert_hf_to_gguf.py` writes from the saved checkpoint
    (f32 unless `outtype` says, no MTP), given a tokenizer: the VOCAB byte-level pieces, the
    EOS named `<|endoftext|>` and the last one the only merge's. The
    converter recognises a tokenizer by a hash of its pre-tokenizer's output and knows no
    such tiny one, so that lookup alone is answered ("default"); every tensor and key is the
    converter's."""
    import subprocess
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    folder = os.path.dirname(path)
    # transformers' Qwen3.5 tokenizer adds `<|endoftext|>` when the vocabulary lacks it:
    # it is the EOS (id 2) here, so the vocabulary stays VOCAB tokens.
    pieces = byte_pieces()
    pieces[config.eos_token_id] = "<|endoftext|>"
    # llama.cpp loads no byte-level vocabulary without merges: the last byte's id is the
    # merge of "Ġ" and "t".
    pieces[VOCAB - 1] = "Ġt"
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)},
                               merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
    code = (
        "import sys, runpy\n"
        f"sys.path[:0] = [{LLAMA_CPP!r}, {os.path.join(LLAMA_CPP, 'gguf-py')!r}]\n"
        "import conversion.base as base\n"
        "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'default'\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {folder!r}, '--outfile', {path!r},"
        f" '--outtype', {outtype!r}, '--no-mtp']\n"
        f"runpy.run_path({os.path.join(LLAMA_CPP, 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(folder, name))


def long_case(model, vocab, n):
    """One prompt of `n` tokens (seed 4242) computed in one forward pass: the top-20 logits at
    its last position and the logits of ids 0..63 at a few positions, in long.json."""
    g = torch.Generator().manual_seed(4242)
    ids = torch.randint(0, min(vocab, VOCAB), (1, n), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0]
    top = torch.topk(logits[-1], 20)
    positions = [63, 64, n // 2, n - 1]
    return {"n_input": n, "input_ids": ids[0].tolist(),
            "last_top20": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
            "first64_positions": positions,
            "first64_logits": [logits[p, :64].tolist() for p in positions]}


def make(name, config_class, model_class, extra, seed, gguf_writer=None, prepare=None,
         long_prompt=0):
    """`prepare(model, config, folder)`, when given, changes the randomised model before its
    files and references are written and returns the GGUF writer. With `long_prompt`, a
    prompt of that many tokens goes to long.json (`long_case`)."""
    if WANTED and name not in WANTED:
        return
    config = config_class(**dict(SHAPE, **extra))
    config.architectures = [model_class.__name__]
    # Soft-capping and sinks run in transformers' eager attention only.
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    randomise(model)
    folder = os.path.join(OUT, name)
    if prepare:
        gguf_writer = prepare(model, config, folder)
    os.makedirs(folder, exist_ok=True)
    config.save_pretrained(folder)
    if hasattr(config, "num_experts_per_tok"):
        # Experts as published checkpoints store them (one tensor per expert and
        # projection): save_pretrained converts transformers 5's fused in-memory layout back.
        model.save_pretrained(folder, safe_serialization=True)
    else:
        # A tied head is the embedding table: written once, as save_pretrained writes it.
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()
                   if not (config.tie_word_embeddings and k == "lm_head.weight")}
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    input_seed, cases = reference(model, seed, config.vocab_size)
    if gguf_writer:
        gguf_writer(model, config, os.path.join(folder, "model.gguf"))
    ref = {
        "model": name,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": getattr(gguf, "__version__", "unknown")},
        "construction": {"weights_seed": 0, "scale": 8, "norms": "U(0.5, 1.5)",
                         "input_seed": input_seed, "min_greedy_margin": MIN_MARGIN},
        "greedy_steps": GREEDY_STEPS,
        "runs": {"float32": {"compute_dtype": "float32", "cases": cases}},
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f)
    if long_prompt:
        with open(os.path.join(folder, "long.json"), "w") as f:
            json.dump(long_case(model, config.vocab_size, long_prompt), f)
    print(name, "input seed", input_seed,
          "smallest margin", min(m for c in cases for m in c["greedy_margins"]))


# MXFP4's E2M1 values by 4-bit code (OpenAI's table; ggml's kvalues_mxfp4 are them doubled).
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantise(w):
    """w [..., K] (K a multiple of 32) rounded to MXFP4: per block of 32, the power of two
    that brings the largest magnitude within 6, each value to its nearest E2M1 code.
    Returns (codes uint8 [..., K], E8M0 exponents uint8 [..., K/32], the dequantised values)."""
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 6.0))
    scale = torch.pow(2.0, exp)
    table = torch.tensor(FP4_VALUES)
    codes = (blocks / scale).unsqueeze(-1).sub(table).abs().argmin(-1)
    deq = table[codes] * scale
    return (codes.reshape(w.shape).to(torch.uint8), (exp.squeeze(-1) + 127).to(torch.uint8),
            deq.reshape(w.shape))


def openai_blocks(codes):
    """Codes [..., K] as OpenAI's `_blocks` [..., K/32, 16]: values 2j and 2j + 1 in the low
    and high nibbles of byte j."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 32, 16, 2)
    return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)


def ggml_mxfp4(codes, exps):
    """Codes [..., K] and exponents [..., K/32] as ggml's MXFP4 bytes [..., K/32 * 17]: the
    scale, then values j and j + 16 in the low and high nibbles of byte j."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 32, 2, 16)
    qs = (c[..., 0, :] | (c[..., 1, :] << 4)).to(torch.uint8)
    out = torch.cat([exps.unsqueeze(-1), qs], dim=-1)
    return out.reshape(*codes.shape[:-1], -1).numpy()


# The tiny gpt-oss vocabulary's merges (GGUF byte-level BPE needs some), after the bytes.
GPT_OSS_MERGES = [("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r")]
# gpt-oss's harmony tokens in the tiny vocabulary (after the bytes and merges), in o200k_harmony's
# order: <|startoftext|> 199998, <|endoftext|> 199999, <|return|> 200002, <|constrain|>
# 200003, <|channel|> 200005, <|start|> 200006, <|end|> 200007, <|message|> 200008,
# <|call|> 200012.
HARMONY_TOKENS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                  "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]
HARMONY_BASE = 256 + len(GPT_OSS_MERGES)
GPT_OSS_VOCAB = HARMONY_BASE + len(HARMONY_TOKENS)


def byte_pieces():
    """GPT-2's byte-level pieces of the 256 bytes, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    by_byte = dict(zip(bs, cs))
    return [chr(by_byte[b]) for b in range(256)]


def gpt_oss_experts_to_mxfp4(model):
    """Rounds every expert matrix to MXFP4 along its input dimension (as the published
    checkpoints hold them) and returns, per layer, the codes and exponents of gate_up
    [experts, 2 x width, hidden] and down [experts, hidden, width] (out x in)."""
    packed = []
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            # transformers keeps x . W: gate_up_proj [experts, hidden, 2 x width].
            gu_codes, gu_exps, gu = mxfp4_quantise(ex.gate_up_proj.transpose(1, 2))
            dn_codes, dn_exps, dn = mxfp4_quantise(ex.down_proj.transpose(1, 2))
            ex.gate_up_proj.copy_(gu.transpose(1, 2))
            ex.down_proj.copy_(dn.transpose(1, 2))
            packed.append(((gu_codes, gu_exps), (dn_codes, dn_exps)))
    return packed


def write_gpt_oss_mxfp4_checkpoint(model, config, packed, folder):
    """The checkpoint as OpenAI publishes gpt-oss: experts as MXFP4 `_blocks` / `_scales`
    beside everything else in f32, and a config with its quantization_config; checked
    against transformers' own dequantisation of those blocks."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    os.makedirs(folder, exist_ok=True)
    tensors = {}
    for k, v in model.state_dict().items():
        if ".mlp.experts.gate_up_proj" in k and not k.endswith("_bias"):
            continue
        if ".mlp.experts.down_proj" in k and not k.endswith("_bias"):
            continue
        tensors[k] = v.contiguous()
    for i, ((gu_codes, gu_exps), (dn_codes, dn_exps)) in enumerate(packed):
        for part, codes, exps, param in [
                ("gate_up_proj", gu_codes, gu_exps, model.model.layers[i].mlp.experts.gate_up_proj),
                ("down_proj", dn_codes, dn_exps, model.model.layers[i].mlp.experts.down_proj)]:
            blocks = openai_blocks(codes)
            deq = convert_moe_packed_tensors(blocks, exps, dtype=torch.float32)
            # transformers returns them as x . W, [experts, in, out], as the f32 model holds them.
            assert torch.equal(deq, param.data), f"layer {i} {part}"
            tensors[f"model.layers.{i}.mlp.experts.{part}_blocks"] = blocks.contiguous()
            tensors[f"model.layers.{i}.mlp.experts.{part}_scales"] = exps.contiguous()
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(os.path.dirname(folder), "config.json")))
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def gpt_oss_gguf_writer(packed):
    """A `gpt-oss` GGUF file as llama.cpp's converter writes one from the MXFP4 checkpoint
    (`GptOssModel`): experts as MXFP4 `ffn_{gate,up,down}_exps` (gate and up de-interleaved),
    their biases split the same way, the sinks as `attn_sinks.weight`, the pre-FFN norm as
    `post_attention_norm`, the YaRN keys; a byte-level vocabulary with the harmony tokens."""
    def write(model, config, path):
        c = config
        rope = c.rope_parameters
        w = gguf.GGUFWriter(path, "gpt-oss")
        add_shape(w, c)
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
        w.add_rope_dimension_count(c.head_dim)
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_expert_count(c.num_local_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.intermediate_size)
        w.add_sliding_window(c.sliding_window)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-4o")
        merged = [a + b for a, b in GPT_OSS_MERGES]
        w.add_token_list(byte_pieces() + merged + HARMONY_TOKENS)
        w.add_token_types([1] * HARMONY_BASE + [3] * len(HARMONY_TOKENS))
        w.add_token_merges([f"{a} {b}" for a, b in GPT_OSS_MERGES])
        w.add_bos_token_id(HARMONY_BASE + HARMONY_TOKENS.index("<|startoftext|>"))
        w.add_eos_token_id(HARMONY_BASE + HARMONY_TOKENS.index("<|return|>"))
        sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
        w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
        w.add_tensor("output_norm.weight", sd["model.norm.weight"])
        w.add_tensor("output.weight", sd["lm_head.weight"])
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            for name, hf in [("attn_norm", "input_layernorm"),
                             ("post_attention_norm", "post_attention_layernorm"),
                             ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                             ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                             ("ffn_gate_inp", "mlp.router")]:
                for suffix in ["weight", "bias"]:
                    if p + hf + "." + suffix in sd:
                        w.add_tensor(f"blk.{i}.{name}.{suffix}", sd[p + hf + "." + suffix])
            w.add_tensor(f"blk.{i}.attn_sinks.weight", sd[p + "self_attn.sinks"])
            (gu_codes, gu_exps), (dn_codes, dn_exps) = packed[i]
            w.add_tensor(f"blk.{i}.ffn_gate_exps.weight",
                         ggml_mxfp4(gu_codes[:, ::2], gu_exps[:, ::2]),
                         raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            w.add_tensor(f"blk.{i}.ffn_up_exps.weight",
                         ggml_mxfp4(gu_codes[:, 1::2], gu_exps[:, 1::2]),
                         raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            w.add_tensor(f"blk.{i}.ffn_down_exps.weight", ggml_mxfp4(dn_codes, dn_exps),
                         raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            bias = sd[p + "mlp.experts.gate_up_proj_bias"]
            w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(bias[:, ::2]))
            w.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(bias[:, 1::2]))
            w.add_tensor(f"blk.{i}.ffn_down_exps.bias", sd[p + "mlp.experts.down_proj_bias"])
        close(w)
    return write


WANTED = set(sys.argv[1:])


def main():
    torch.set_num_threads(2)
    from transformers import MistralConfig, MistralForCausalLM
    # Mistral without a window (as Mistral 7B v0.2+), and with a window of 5: shorter than
    # four of the five prompts, so every case but the 1-token one attends through it.
    make("mistral-tiny", MistralConfig, MistralForCausalLM, dict(sliding_window=None), 1237,
         gguf_writer_for("llama", permute_qk=True))
    make("mistral-tiny-window", MistralConfig, MistralForCausalLM, dict(sliding_window=5), 1237)
    # Qwen2 with YaRN (factor 4 over an original context of 32, so the ramp falls inside the
    # tiny head's frequencies), written in transformers 5's `rope_parameters`. The factor is
    # used as written (transformers 5, vLLM); transformers 4.5x derived it from
    # max_position_embeddings / original_max_position_embeddings (16 here) instead.
    from transformers import Qwen2Config, Qwen2ForCausalLM
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32}
    make("qwen2-tiny-yarn", Qwen2Config, Qwen2ForCausalLM, dict(rope_parameters=yarn), 1237,
         gguf_writer_for("qwen2", permute_qk=False))
    # Phi-3 / Phi-4-mini's layout: fused q/k/v and gate/up, three quarters of each 16-wide
    # head rotated (6 frequencies), LongRoPE over an original context of 32 in a 512-position
    # model, and the head tied to the embeddings. transformers picks the short factors while
    # a sequence is within 32 positions (the 1- and 7-token cases, 24 steps included) and
    # the long ones past it (the others).
    from transformers import Phi3Config, Phi3ForCausalLM
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 20.0]}
    make("phi3-tiny-longrope", Phi3Config, Phi3ForCausalLM,
         dict(rope_parameters=longrope, original_max_position_embeddings=32,
              tie_word_embeddings=True, pad_token_id=None, sliding_window=None), 1237,
         phi3_gguf_writer)
    # Phi-3-mini-4k's: a window on every layer (5 here, shorter than four of the prompts;
    # llama.cpp's converter writes it as phi3.attention.sliding_window), the whole head
    # rotated without scaling, an untied head.
    make("phi3-tiny-window", Phi3Config, Phi3ForCausalLM,
         dict(original_max_position_embeddings=512, pad_token_id=None, sliding_window=5), 1237,
         phi3_gguf_writer)
    # Gemma 3: six layers, five sliding (window 5) to a global one, each kind with its RoPE
    # base (10,000 and 1,000,000), QK-norm, sandwich norms, GeGLU, a tied head.
    # query_pre_attn_scalar equals head_dim, as llama.cpp assumes for GGUF files.
    from transformers import Gemma3TextConfig, Gemma3ForCausalLM
    gemma_rope = {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    make("gemma3-tiny", Gemma3TextConfig, Gemma3ForCausalLM,
         dict(num_hidden_layers=6, intermediate_size=64, sliding_window=5,
              rope_parameters=gemma_rope, query_pre_attn_scalar=16, tie_word_embeddings=True,
              pad_token_id=0), 1237, gemma_gguf_writer("gemma3"))
    # Gemma 2: a sliding layer (window 5) and a global one, attention logits capped at 50
    # and output logits at 30.
    from transformers import Gemma2Config, Gemma2ForCausalLM
    make("gemma2-tiny", Gemma2Config, Gemma2ForCausalLM,
         dict(intermediate_size=64, sliding_window=5, query_pre_attn_scalar=16,
              attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
              tie_word_embeddings=True, pad_token_id=0), 1237, gemma_gguf_writer("gemma2"))
    # Qwen3-MoE: three layers, the middle one dense (mlp_only_layers), the others with 4
    # experts of width 32, two per token, their weights renormalised (norm_topk_prob) as in
    # the published models; then 8 experts on every layer, two per token, the softmax's
    # weights as they are. transformers 5 writes the expert count as num_local_experts.
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    make("qwen3moe-tiny", Qwen3MoeConfig, Qwen3MoeForCausalLM,
         dict(num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1), 1237,
         gguf_writer_for("qwen3moe", permute_qk=False))
    make("qwen3moe-tiny-unnormalised", Qwen3MoeConfig, Qwen3MoeForCausalLM,
         dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=1), 1237,
         gguf_writer_for("qwen3moe", permute_qk=False))
    # Qwen3.5 and Qwen3-Next: three Gated DeltaNet layers to a gated full-attention one
    # (layer_types' default), 2 key heads serving 4 value heads of the DeltaNet, a quarter of
    # each 16-wide attention head rotated; the 90-token prompt is longer than one 64-token
    # chunk of the chunked prefill. Dense Qwen3.5 (separate in_proj_qkv/z/b/a); Qwen3.5-MoE
    # and Qwen3-Next with 4 experts of width 32, two per token, and a gated shared expert of
    # width 48 (Qwen3-Next fuses in_proj_qkvz and in_proj_ba per key head).
    from transformers import (Qwen3_5TextConfig, Qwen3_5ForCausalLM, Qwen3_5MoeTextConfig,
                              Qwen3_5MoeForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)
    delta_net = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=16, linear_conv_kernel_dim=4, bos_token_id=1,
                     eos_token_id=2)
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=48)
    # Qwen3.5's also with a 1,000-token prompt (long.json), through 15 of transformers'
    # 64-token chunks and a part.
    make("qwen35-tiny", Qwen3_5TextConfig, Qwen3_5ForCausalLM,
         dict(num_hidden_layers=4, max_position_embeddings=2048, **delta_net), 1237,
         llama_cpp_converter, long_prompt=1000)
    make("qwen35moe-tiny", Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM,
         dict(num_hidden_layers=4, **delta_net, **experts), 1237, llama_cpp_converter)
    make("qwen3next-tiny", Qwen3NextConfig, Qwen3NextForCausalLM,
         dict(num_hidden_layers=4, norm_topk_prob=True, **delta_net, **experts), 1237,
         llama_cpp_converter)
    # gpt-oss: two layers, the first sliding (window 5), the second full; 4 experts of width
    # 32, two per token; biases everywhere, sinks, YaRN (factor 4 over an original context
    # of 32, untruncated as published). The experts are rounded to MXFP4 first, so that the
    # f32 checkpoint (model.safetensors, as save_pretrained writes it), the MXFP4 one
    # (mxfp4/, OpenAI's blocks and scales) and the GGUF hold the same weights. The
    # vocabulary is the 256 bytes, four merges and the harmony tokens.
    from transformers import GptOssConfig, GptOssForCausalLM

    def gpt_oss_prepare(model, config, folder):
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.uniform_(-1.0, 3.0)
        packed = gpt_oss_experts_to_mxfp4(model)
        os.makedirs(folder, exist_ok=True)
        config.save_pretrained(folder)
        write_gpt_oss_mxfp4_checkpoint(model, config, packed, os.path.join(folder, "mxfp4"))
        return gpt_oss_gguf_writer(packed)

    yarn = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32}
    eos = [HARMONY_BASE + HARMONY_TOKENS.index(t)
           for t in ["<|return|>", "<|endoftext|>", "<|call|>"]]
    make("gpt-oss-tiny", GptOssConfig, GptOssForCausalLM,
         dict(vocab_size=GPT_OSS_VOCAB, intermediate_size=32, num_local_experts=4,
              max_position_embeddings=4096,
              num_experts_per_tok=2, sliding_window=5,
              layer_types=["sliding_attention", "full_attention"], rope_parameters=yarn,
              attention_bias=True, bos_token_id=HARMONY_BASE, eos_token_id=eos,
              pad_token_id=HARMONY_BASE + 1),
         1237, prepare=gpt_oss_prepare)


if __name__ == "__main__":
    main()
