#!/usr/bin/env python3
"""Reference data for LoRA adapters: tests/golden/smollm2-lora.json.

No LoRA adapter for the default model is reachable from these machines, so the adapter is made
from a formula (tests/lorafix.h states it; `lorafix_value` below is the same arithmetic), in
the layout llama.cpp's convert_lora_to_gguf.py writes: general.type "adapter", adapter.type
"lora", adapter.lora.alpha, and for every layer's attn_q, attn_k, attn_v, attn_output,
ffn_gate, ffn_up and ffn_down a pair "blk.N.<name>.weight.lora_a" [rank][in] and ".lora_b"
[out][rank], float32. The C tests write the same file (tests/lorafix.c).

llama.cpp (llama-cpp-python, the default model's weights dequantized to fp32 as
tools/make-golden-archs.py writes them, an fp32 KV cache) runs it at lora_scale SCALE; the
logits are recorded per prompt as make-golden-archs.py records them, with how far the model
without the adapter is from them.

Run with the venv tools/make-golden.sh sets up:  .venv-golden/bin/python tools/make-golden-lora.py
"""
import json
import os
import tempfile

import numpy as np

from golden_record import golden_cases, greedy_record
from importlib import import_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = os.path.join(ROOT, "tests", "golden", "smollm2.json")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2-lora.json")
N_NEW = 24
TOPK = 5
PROMPTS = ["chat-capital", "chat-code"]
ADAPTER = {"rank": 8, "alpha": 16.0, "seed": 7, "amp_a": 0.05, "amp_b": 0.2}
SCALE = 0.75
TARGETS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
M32 = np.uint64(0xFFFFFFFF)


def lorafix_value(n, layer, target, which, seed, amp):
    i = np.arange(n, dtype=np.uint64)
    const = (layer * 2246822519 + target * 3266489917 + which * 668265263 + seed) & 0xFFFFFFFF
    h = (i * np.uint64(2654435761) + np.uint64(const)) & M32
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & M32
    h ^= h >> np.uint64(13)
    return (((h % np.uint64(2001)).astype(np.int64) - 1000) / 1000.0 * amp).astype(np.float32)


def write_adapter(reader, path):
    import gguf
    kv = {name: f for name, f in reader.fields.items()}

    def u32(key):
        return int(kv[key].parts[kv[key].data[0]][0])
    dim, ffn = u32("llama.embedding_length"), u32("llama.feed_forward_length")
    heads, kv_heads = u32("llama.attention.head_count"), u32("llama.attention.head_count_kv")
    hd = dim // heads
    q, kvd = heads * hd, kv_heads * hd
    shapes = {"attn_q": (dim, q), "attn_k": (dim, kvd), "attn_v": (dim, kvd),
              "attn_output": (q, dim), "ffn_gate": (dim, ffn), "ffn_up": (dim, ffn),
              "ffn_down": (ffn, dim)}
    r, seed = ADAPTER["rank"], ADAPTER["seed"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", ADAPTER["alpha"])
    for layer in range(u32("llama.block_count")):
        for t, name in enumerate(TARGETS):
            n_in, n_out = shapes[name]
            a = lorafix_value(r * n_in, layer, t, 0, seed, ADAPTER["amp_a"]).reshape(r, n_in)
            b = lorafix_value(n_out * r, layer, t, 1, seed, ADAPTER["amp_b"]).reshape(n_out, r)
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    import gguf
    import llama_cpp
    archs = import_module("make-golden-archs")

    cases, sha = golden_cases(GOLDEN, os.path.join(ROOT, "models", MODEL_FILE))
    reader = gguf.GGUFReader(os.path.join(ROOT, "models", MODEL_FILE))
    tmp = tempfile.mkdtemp()
    model_path = os.path.join(tmp, "llama-f32.gguf")
    lora_path = os.path.join(tmp, "lora.gguf")
    archs.write_variant(reader, {"arch": "llama"}, model_path)
    write_adapter(reader, lora_path)

    def runner(**kw):
        llm = llama_cpp.Llama(model_path=model_path, n_ctx=256, n_batch=256,
                              n_threads=os.cpu_count(), logits_all=True, type_k=0, type_v=0,
                              flash_attn=False, verbose=False, **kw)

        def logits_of(ids):
            llm.reset()
            llm.eval(ids)
            return np.array(llm.scores[:len(ids)], dtype=np.float32)
        return logits_of

    plain = runner()
    adapted = runner(lora_path=lora_path, lora_scale=SCALE)
    out = []
    for pname in PROMPTS:
        prompt = cases[pname]["prompt_ids"]
        greedy, gaps, entries, worst = greedy_record(adapted, prompt, N_NEW, (0, 8, 16), TOPK,
                                                     other=plain)
        out.append({"name": f"lora-{pname}", "prompt_ids": prompt, "greedy_ids": greedy,
                    "top2_gap": gaps, "logits": entries, "base_worst_rel_diff": worst,
                    "base_greedy_ids": cases[pname]["greedy_ids"][:N_NEW]})
        print(f"lora-{pname}: the model without the adapter is {worst:.3f} away (worst relative "
              f"top-5 logit); greedy {greedy[:8]}... base {cases[pname]['greedy_ids'][:8]}...")
    for p in (model_path, lora_path):
        os.unlink(p)
    os.rmdir(tmp)
    json.dump({"model_file": MODEL_FILE, "model_sha256": sha, "adapter": ADAPTER, "scale": SCALE,
               "targets": TARGETS,
               "made_by": f"tools/make-golden-lora.py, llama-cpp-python {llama_cpp.__version__} "
                          "(fp32 weights and KV cache, the adapter in float32)",
               "cases": out}, open(OUT, "w"), indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
