#!/usr/bin/env python3
"""A tiny random-weight whisper model in whisper.cpp's own binary format (the "ggml" file
whisper-cli -m loads), and a short 16 kHz mono WAV to transcribe with it.

The format, as whisper.cpp 1.9's whisper_model_load reads it (all little-endian):
  u32 magic 0x67676d6c ("ggml")
  i32 n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
      n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype
  i32 n_mel, n_fft; f32 filters[n_mel][n_fft]                 (the mel filter bank)
  i32 n_words; n_words x (u32 length, bytes)                   (the vocabulary)
  tensors until the end: i32 n_dims, i32 name length, i32 ggml type,
      i32 ne[n_dims] (ggml order: ne[0] varies fastest), the name, the data
The loader fixes the special tokens by position (English-only: n_vocab 51864, end of text
50256, start 50257, timestamps from 50363), so n_vocab cannot shrink; it names the words the
file leaves out itself. It requires the word " " (its blank suppression looks it up).
The big matrices (attention, MLP, token embedding) are in the file's type (F32, F16 or
Q8_0); the convolutions are F16 unless the file is F32; the rest is F32.

usage: gen_whisper.py OUT.bin [f32|f16|q8_0] [--state N] [--heads N] [--layers N]
                      [--text-layers N] [--text-ctx N] [--seed N]
       gen_whisper.py --wav OUT.wav [--seconds S]
"""
import argparse
import math
import random
import struct
import sys

N_VOCAB = 51864          # English-only whisper: the loader's special token ids assume it
N_WORDS = 50256          # the ordinary tokens (ids below end-of-text); the file names them
N_MELS = 80
N_FFT_BINS = 201         # 1 + 400 / 2: whisper's STFT bins, bin 0 to Nyquist
N_AUDIO_CTX = 1500       # 30 s of audio after the stride-2 convolution

GGML_TYPE = {"f32": 0, "f16": 1, "q8_0": 8}
FTYPE = {"f32": 0, "f16": 1, "q8_0": 7 + 2 * 1000}  # ggml_ftype + GGML_QNT_VERSION * 1000


def q8_0_bytes(vals):
    """ggml's Q8_0: blocks of 32, an f16 scale d = max|x| / 127 and 32 int8 round(x / d)."""
    out = bytearray()
    for b in range(0, len(vals), 32):
        blk = vals[b:b + 32]
        amax = max(abs(v) for v in blk)
        d = amax / 127.0
        inv = 1.0 / d if d else 0.0
        out += struct.pack("<e", d)
        out += struct.pack("<32b", *(max(-127, min(127, round(v * inv))) for v in blk))
    return bytes(out)


def tensor_bytes(vals, kind):
    if kind == "f32":
        return struct.pack(f"<{len(vals)}f", *vals)
    if kind == "f16":
        return struct.pack(f"<{len(vals)}e", *vals)
    return q8_0_bytes(vals)


def write_model(path, kind, n_state, n_head, n_layer, n_text_layer, n_text_ctx, seed):
    if n_state % n_head:
        sys.exit(f"gen_whisper.py: --state {n_state} is not a multiple of --heads {n_head}")
    if kind == "q8_0" and n_state % 32:
        sys.exit(f"gen_whisper.py: Q8_0 needs --state a multiple of 32 (got {n_state})")
    rng = random.Random(seed)
    conv_kind = "f32" if kind == "f32" else "f16"
    f = open(path, "wb")
    f.write(struct.pack("<I", 0x67676D6C))
    f.write(struct.pack("<11i", N_VOCAB, N_AUDIO_CTX, n_state, n_head, n_layer, n_text_ctx,
                        n_state, n_head, n_text_layer, N_MELS, FTYPE[kind]))

    # mel filters: triangles evenly spaced over the bins, each summing to about 1
    f.write(struct.pack("<2i", N_MELS, N_FFT_BINS))
    step = (N_FFT_BINS - 1) / (N_MELS + 1)
    for m in range(N_MELS):
        lo, mid, hi = m * step, (m + 1) * step, (m + 2) * step
        row = []
        for k in range(N_FFT_BINS):
            if lo < k <= mid:
                row.append((k - lo) / (mid - lo) / step)
            elif mid < k < hi:
                row.append((hi - k) / (hi - mid) / step)
            else:
                row.append(0.0)
        f.write(struct.pack(f"<{N_FFT_BINS}f", *row))

    # vocabulary: " " (GPT-2's id 220, which the loader looks up) and " w<id>" for the rest
    f.write(struct.pack("<i", N_WORDS))
    for i in range(N_WORDS):
        w = b" " if i == 220 else b" w%d" % i
        f.write(struct.pack("<I", len(w)) + w)

    def tensor(name, ne, kind_, scale, mean=0.0):
        n = 1
        for d in ne:
            n *= d
        vals = [mean + scale * (2.0 * rng.random() - 1.0) for _ in range(n)]
        nb = name.encode()
        f.write(struct.pack("<3i", len(ne), len(nb), GGML_TYPE[kind_]))
        f.write(struct.pack(f"<{len(ne)}i", *ne))
        f.write(nb)
        f.write(tensor_bytes(vals, kind_))

    s, ff = n_state, 4 * n_state
    w_in = math.sqrt(3.0 / s)       # uniform(-a, a) with variance 1 / fan_in
    w_ff = math.sqrt(3.0 / ff)

    def norm(prefix, weight_mean=1.0):
        tensor(prefix + ".weight", [s], "f32", 1.0 - weight_mean * 0.9, weight_mean)
        tensor(prefix + ".bias", [s], "f32", 0.1)

    def attn(prefix):
        tensor(prefix + ".query.weight", [s, s], kind, w_in)
        tensor(prefix + ".query.bias", [s], "f32", 0.1)
        tensor(prefix + ".key.weight", [s, s], kind, w_in)
        tensor(prefix + ".value.weight", [s, s], kind, w_in)
        tensor(prefix + ".value.bias", [s], "f32", 0.1)
        tensor(prefix + ".out.weight", [s, s], kind, w_in)
        tensor(prefix + ".out.bias", [s], "f32", 0.1)

    def mlp(prefix):
        tensor(prefix + ".mlp.0.weight", [s, ff], kind, w_in)
        tensor(prefix + ".mlp.0.bias", [ff], "f32", 0.1)
        tensor(prefix + ".mlp.2.weight", [ff, s], kind, w_ff)
        tensor(prefix + ".mlp.2.bias", [s], "f32", 0.1)

    tensor("encoder.positional_embedding", [s, N_AUDIO_CTX], "f32", 0.5)
    tensor("encoder.conv1.weight", [3, N_MELS, s], conv_kind, math.sqrt(3.0 / (3 * N_MELS)))
    tensor("encoder.conv1.bias", [1, s], "f32", 0.1)
    tensor("encoder.conv2.weight", [3, s, s], conv_kind, math.sqrt(3.0 / (3 * s)))
    tensor("encoder.conv2.bias", [1, s], "f32", 0.1)
    for i in range(n_layer):
        p = f"encoder.blocks.{i}"
        norm(p + ".attn_ln")
        attn(p + ".attn")
        norm(p + ".mlp_ln")
        mlp(p)
    norm("encoder.ln_post")

    tensor("decoder.positional_embedding", [s, n_text_ctx], "f32", 0.5)
    # a wide token embedding (it is also the output projection): decisive greedy choices
    tensor("decoder.token_embedding.weight", [s, N_VOCAB], kind, 1.0)
    for i in range(n_text_layer):
        p = f"decoder.blocks.{i}"
        norm(p + ".attn_ln")
        attn(p + ".attn")
        norm(p + ".cross_attn_ln")
        attn(p + ".cross_attn")
        norm(p + ".mlp_ln")
        mlp(p)
    # the final norm's weights of either sign: the tied output projection would otherwise
    # favour the input token's own embedding and repeat it
    norm("decoder.ln", 0.0)
    f.close()


def write_wav(path, seconds, seed):
    """16 kHz mono 16-bit PCM: a rising tone, a second tone and a little noise."""
    rng = random.Random(seed)
    rate = 16000
    n = int(rate * seconds)
    samples = []
    for i in range(n):
        t = i / rate
        v = 0.4 * math.sin(2 * math.pi * (300 + 400 * t) * t) + 0.2 * math.sin(2 * math.pi * 1200 * t)
        v += 0.05 * (2 * rng.random() - 1)
        samples.append(max(-32767, min(32767, int(v * 32767))))
    data = struct.pack(f"<{n}h", *samples)
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE")
        f.write(b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16))
        f.write(b"data" + struct.pack("<I", len(data)) + data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("type", nargs="?", default="f32", choices=sorted(GGML_TYPE))
    ap.add_argument("--wav", action="store_true", help="write a WAV file instead of a model")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--state", type=int, default=64)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--text-layers", type=int, default=1,
                    help="decoder layers (2 makes whisper.cpp take it for a distilled model)")
    ap.add_argument("--text-ctx", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.wav:
        write_wav(a.out, a.seconds, a.seed)
    else:
        write_model(a.out, a.type, a.state, a.heads, a.layers, a.text_layers, a.text_ctx, a.seed)


if __name__ == "__main__":
    main()
