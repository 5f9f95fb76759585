#!/usr/bin/env python3
"""Write a random-weight LLaMA-architecture GGUF model for llama-server.

The model is for exercising a real inference engine end to end (health,
slots, metrics, streaming, admission) where no trained weights can be had:
its answers are noise, its speed is that of a ~15M-parameter model. It uses
llama.cpp's own gguf-py (put its directory on PYTHONPATH or pass --gguf-py)
and writes:

- LLaMA hyperparameters (general.architecture "llama", context length,
  embedding length, block count, feed-forward length, head counts, RoPE
  dimension and base, RMS-norm epsilon);
- a SentencePiece-style ("llama") vocabulary small enough to read: the
  three special tokens, the 256 byte-fallback tokens <0x00>..<0xFF>, the
  printable ASCII characters, and every prefix of the words Sluice's load
  generator writes its prompts with (internal/bench: fillerWords and
  "Request N."), each with a leading "\u2581", so prompts tokenise into
  about one token per word rather than one per byte;
- token scores and types, BOS/EOS/UNK ids, and a plain chat template that
  joins the messages' contents;
- F16 weight matrices drawn from N(0, 0.02^2) with a fixed seed, F32 norms
  of ones.

Usage: random_gguf.py OUT.gguf [--seed N] [--gguf-py DIR]
"""

import argparse
import os
import sys

# The words internal/bench/run.go (fillerWords) builds prompts from, and
# the head each prompt starts with ("Request 12. ").
PROMPT_WORDS = """the router measures every worker before it sends a request and
keeps the queue short when memory on the card runs low so that tail latency stays close to the median
while throughput remains high across long prompts short answers bursts of traffic and quiet hours
Request""".split()

SHAPE = dict(
    n_ctx_train=8192,
    n_embd=384,
    n_layer=8,
    n_head=6,
    n_head_kv=2,
    n_ff=1280,
    rope_base=10000.0,
    rms_eps=1e-5,
)

SPACE = "\u2581"  # SentencePiece's word-boundary marker


def vocabulary(gguf):
    """Tokens, scores and types: specials, bytes, characters, word prefixes."""
    tokens, scores, types = [], [], []

    def add(text, score, kind):
        tokens.append(text)
        scores.append(score)
        types.append(kind)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for b in range(256):
        add("<0x%02X>" % b, 0.0, gguf.TokenType.BYTE)
    seen = set(tokens)
    pieces = [SPACE] + [chr(c) for c in range(0x21, 0x7F)]
    for w in PROMPT_WORDS:
        # Every prefix of "\u2581word": SentencePiece merges pairs of
        # symbols into tokens that exist, so the whole word is reached one
        # character at a time; longer pieces score higher.
        piece = SPACE + w
        pieces += [piece[:i] for i in range(2, len(piece) + 1)]
    for p in pieces:
        if p not in seen:
            seen.add(p)
            add(p, -1000.0 + 10.0 * len(p), gguf.TokenType.NORMAL)
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the .gguf file to write")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random weights")
    ap.add_argument("--gguf-py", help="llama.cpp's gguf-py directory (else gguf must be importable)")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    import numpy as np
    import gguf

    s = SHAPE
    head_dim = s["n_embd"] // s["n_head"]
    tokens, scores, types = vocabulary(gguf)
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name("sluice-random-llama")
    w.add_context_length(s["n_ctx_train"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template("{% for message in messages %}{{ message['content'] }}\n{% endfor %}")

    rng = np.random.default_rng(args.seed)
    n_params = 0

    def matrix(name, rows, cols):
        nonlocal n_params
        # numpy shape (rows, cols) is GGUF's ne = [cols, rows]: cols is the
        # input dimension of the matmul.
        w.add_tensor(name, rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float16))
        n_params += rows * cols

    def norm(name, n):
        nonlocal n_params
        w.add_tensor(name, np.ones(n, dtype=np.float32))
        n_params += n

    d, kv = s["n_embd"], s["n_head_kv"] * head_dim
    matrix("token_embd.weight", n_vocab, d)
    for i in range(s["n_layer"]):
        b = "blk.%d." % i
        norm(b + "attn_norm.weight", d)
        matrix(b + "attn_q.weight", d, d)
        matrix(b + "attn_k.weight", kv, d)
        matrix(b + "attn_v.weight", kv, d)
        matrix(b + "attn_output.weight", d, d)
        norm(b + "ffn_norm.weight", d)
        matrix(b + "ffn_gate.weight", s["n_ff"], d)
        matrix(b + "ffn_up.weight", s["n_ff"], d)
        matrix(b + "ffn_down.weight", d, s["n_ff"])
    norm("output_norm.weight", d)
    matrix("output.weight", n_vocab, d)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: %d parameters, vocabulary of %d tokens, %d bytes"
          % (args.out, n_params, n_vocab, os.path.getsize(args.out)))


if __name__ == "__main__":
    main()
