"""Writes a tiny random-weight llama GGUF with a real tokenizer and chat template.

The prompt-cache scenario measures how many prompt tokens llama-server has to
process per request; that depends on the tokenizer, the chat template and the
prompts, not on what the weights say. So a 2-layer, 64-wide model with
Qwen2's vocabulary (from llama.cpp's `models/ggml-vocab-qwen2.gguf`) and a
real model's template (`models/templates/*.jinja`) is enough, and it runs in
milliseconds on a CPU.

usage: tiny_gguf.py <llama.cpp tree> <template.jinja> <out.gguf>
(with <llama.cpp tree>/gguf-py on PYTHONPATH and numpy installed)
"""

import sys

import numpy as np
import gguf

tree, template, out = sys.argv[1:4]
vocab = gguf.GGUFReader(f"{tree}/models/ggml-vocab-qwen2.gguf")


def field(name):
    return vocab.fields[name].contents()


n_vocab = len(field("tokenizer.ggml.tokens"))
n_embd, n_head, n_ff, n_layer = 64, 4, 128, 2
rng = np.random.default_rng(0)

w = gguf.GGUFWriter(out, arch="llama")
w.add_name("tiny-random")
w.add_block_count(n_layer)
w.add_context_length(8192)
w.add_embedding_length(n_embd)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_freq_base(10000.0)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
w.add_tokenizer_model(field("tokenizer.ggml.model"))
w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
w.add_token_list(field("tokenizer.ggml.tokens"))
w.add_token_types(field("tokenizer.ggml.token_type"))
w.add_token_merges(field("tokenizer.ggml.merges"))
w.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
w.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
w.add_pad_token_id(field("tokenizer.ggml.padding_token_id"))
w.add_add_bos_token(False)
with open(template, encoding="utf-8") as f:
    w.add_chat_template(f.read())


def weights(*shape):
    return (rng.standard_normal(shape) * 0.02).astype(np.float16)


def ones(n):
    return np.ones(n, dtype=np.float32)


w.add_tensor("token_embd.weight", weights(n_vocab, n_embd))
w.add_tensor("output_norm.weight", ones(n_embd))
w.add_tensor("output.weight", weights(n_vocab, n_embd))
for i in range(n_layer):
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.{i}.{name}.weight", weights(n_embd, n_embd))
    w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(n_embd))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", weights(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_up.weight", weights(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_down.weight", weights(n_embd, n_ff))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
