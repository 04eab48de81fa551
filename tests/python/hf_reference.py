#!/usr/bin/env python3
"""An independent check of `hybrid_train export` and model.init_from against Hugging Face's models.

Independent: nothing here is the C++ code. The safetensors reader and writer are written from the
format's description (huggingface/safetensors README: an 8-byte little-endian header length, a
JSON header of {name: {dtype, shape, data_offsets}}, the raw bytes), with json, struct and numpy.
GPT-2 and Llama are written in plain torch from transformers' modeling code (modeling_gpt2.py:
learned positions, Conv1D layers storing [in, out], gelu_new, tied head; modeling_llama.py:
RMSNorm, rotate_half rotary embedding, SwiGLU, grouped-query attention by repeat_kv), reading
the checkpoint by transformers' names.

Both ways, for GPT-2 and a grouped-query Llama with a tied and an untied head:
  export: the C++ helper (tests/launcher/hf_reference_helper.cpp) writes a random decoder as a
    Hugging Face checkpoint plus its logits on random tokens; the logits computed here from the
    checkpoint must equal them;
  import: this script writes random weights, config.json and tokens with its own writer; the
    helper loads them through the importer and writes its logits, which must equal ours here.

Usage: hf_reference.py HELPER WORKDIR. Exit 0: equal within fp32 tolerance; 1: not; 77: no torch
or numpy here (ctest reports a skip; scripts/install-deps.sh --tests installs python3-torch).
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    # Debian's python3-torch is the system interpreter's: a python3 of its own (pyenv, a venv)
    # first on PATH lacks it, so try that one before giving up.
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print(f"hf_reference: skipped: {e} (install python3-torch and python3-numpy)")
    sys.exit(77)

TOLERANCE = 1e-4  # |logit difference|, fp32 against a float64 reference, logits of order 1-10

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "BF16":  # the upper half of a float32
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(DTYPES[entry["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(array.reshape(entry["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        array = t.contiguous().numpy()
        dtype = {np.float32: "F32", np.int64: "I64"}[array.dtype.type]
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def causal_attention(q, k, v):  # (B, H, T, hd) each
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def gpt2_logits(w, cfg, tokens):
    """transformers' GPT2LMHeadModel in evaluation mode."""
    w = {k if k.startswith("transformer.") or k == "lm_head.weight" else "transformer." + k: v.double() for k, v in w.items()}
    d, heads, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    b, t = tokens.shape

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (d,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):  # Conv1D: x @ W + b, W stored [in, out]
        return x @ w[p + ".weight"] + w[p + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    h = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][torch.arange(t)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(d, dim=2)
        split = lambda x: x.view(b, t, heads, d // heads).transpose(1, 2)
        y = causal_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(b, t, d)
        h = h + conv1d(y, p + "attn.c_proj")
        h = h + conv1d(gelu_new(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(h, "transformer.ln_f") @ w["transformer.wte.weight"].t()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_logits(w, cfg, tokens):
    """transformers' LlamaForCausalLM in evaluation mode."""
    w = {k: v.double() for k, v in w.items()}
    d, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    kv_heads, hd = cfg["num_key_value_heads"], d // heads
    b, t = tokens.shape

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    emb = torch.cat((torch.outer(torch.arange(t, dtype=torch.float64), inv_freq),) * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        proj = lambda name, n: (x @ w[p + f"self_attn.{name}.weight"].t()).view(b, t, n, hd).transpose(1, 2)
        q, k, v = proj("q_proj", heads), proj("k_proj", kv_heads), proj("v_proj", kv_heads)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))  # repeat_kv
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        h = h + y @ w[p + "self_attn.o_proj.weight"].t()
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].t(), x @ w[p + "mlp.up_proj.weight"].t()
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return rms(h, w["model.norm.weight"]) @ head.t()


def logits_of(folder, tokens):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    weights = read_safetensors(os.path.join(folder, "model.safetensors"))
    return (gpt2_logits if cfg["model_type"] == "gpt2" else llama_logits)(weights, cfg, tokens)


def python_checkpoint(case, folder):
    """Random weights of transformers' layout, written with this file's writer."""
    g = torch.Generator().manual_seed(7)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.2
    v, t, d, f, layers = 61, 20, 32, 96, 2
    if case == "gpt2":
        cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": v, "n_positions": t,
               "n_embd": d, "n_layer": layers, "n_head": 4, "n_inner": None, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
        w = {"wte.weight": r(v, d), "wpe.weight": r(t, d), "ln_f.weight": 1 + r(d), "ln_f.bias": r(d)}
        for i in range(layers):  # as the published gpt2 file: no "transformer." prefix, a mask buffer
            p = f"h.{i}."
            w.update({p + "ln_1.weight": 1 + r(d), p + "ln_1.bias": r(d), p + "attn.c_attn.weight": r(d, 3 * d),
                      p + "attn.c_attn.bias": r(3 * d), p + "attn.c_proj.weight": r(d, d), p + "attn.c_proj.bias": r(d),
                      p + "ln_2.weight": 1 + r(d), p + "ln_2.bias": r(d), p + "mlp.c_fc.weight": r(d, 4 * d),
                      p + "mlp.c_fc.bias": r(4 * d), p + "mlp.c_proj.weight": r(4 * d, d), p + "mlp.c_proj.bias": r(d),
                      p + "attn.bias": torch.ones(1, 1, t, t).tril()})
    else:
        tied = case == "llama_gqa_tied"
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": v, "hidden_size": d,
               "intermediate_size": f, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": t, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
               "tie_word_embeddings": tied}
        w = {"model.embed_tokens.weight": r(v, d), "model.norm.weight": 1 + r(d)}
        if not tied:
            w["lm_head.weight"] = r(v, d)
        for i in range(layers):
            p = f"model.layers.{i}."
            w.update({p + "self_attn.q_proj.weight": r(d, d), p + "self_attn.k_proj.weight": r(d // 2, d),
                      p + "self_attn.v_proj.weight": r(d // 2, d), p + "self_attn.o_proj.weight": r(d, d),
                      p + "mlp.gate_proj.weight": r(f, d), p + "mlp.up_proj.weight": r(f, d),
                      p + "mlp.down_proj.weight": r(d, f), p + "input_layernorm.weight": 1 + r(d),
                      p + "post_attention_layernorm.weight": 1 + r(d)})
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), w)
    with open(os.path.join(folder, "config.json"), "w") as out:
        json.dump(cfg, out)
    tokens = torch.randint(0, v, (2, t), generator=g)
    write_safetensors(os.path.join(folder, "inputs.safetensors"), {"tokens": tokens})
    return tokens


def main():
    helper, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    worst, failed = 0.0, False
    for case in ("gpt2", "llama_gqa", "llama_gqa_tied"):
        for direction in ("export", "import"):
            folder = os.path.join(work, f"{direction}_{case}")
            os.makedirs(folder)
            if direction == "export":
                subprocess.run([helper, "export", case, folder], check=True)
                tokens = read_safetensors(os.path.join(folder, "expected_tokens.safetensors"))["tokens"]
                ours = read_safetensors(os.path.join(folder, "expected.safetensors"))["logits"]
            else:
                tokens = python_checkpoint(case, folder)
                subprocess.run([helper, "import", folder], check=True)
                ours = read_safetensors(os.path.join(folder, "ours.safetensors"))["logits"]
            reference = logits_of(folder, tokens)
            diff = (ours.double() - reference).abs().max().item()
            worst = max(worst, diff)
            ok = ours.shape == reference.shape and diff < TOLERANCE
            failed |= not ok
            print(f"{direction:6s} {case:15s} logits {tuple(ours.shape)}, max |ours - reference| = {diff:.3g}"
                  f"{'' if ok else '  FAILED'}")
    print(f"hf_reference: worst {worst:.3g} (tolerance {TOLERANCE})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
