"""What the scripts that write random Llama GGUF files with PyPI gguf share (import it with
scripts/ on PYTHONPATH): llama.cpp's tensor names and the closing of the file."""
import numpy as np


def add_random_layers(w, normal, layers, hidden, ffn, q_width, kv_width):
    """Adds each layer's seven weight matrices, `normal(rows, cols)` each, in llama.cpp's names."""
    for i in range(layers):
        for name, shape in [("attn_q", (q_width, hidden)), ("attn_k", (kv_width, hidden)),
                            ("attn_v", (kv_width, hidden)), ("attn_output", (hidden, q_width)),
                            ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)),
                            ("ffn_down", (hidden, ffn))]:
            w.add_tensor(f"blk.{i}.{name}.weight", normal(*shape))


def add_norms_and_write(w, hidden, layers):
    """Adds the RMS norms (all ones) and writes and closes the file."""
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
