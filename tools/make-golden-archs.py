#!/usr/bin/env python3
"""Reference data for the architectures beside llama: tests/golden/smollm2-archs.json.

No Qwen2, Qwen3 or SmolLM3 model is small enough for the tests (nor reachable from these
machines), so the files are made from the default model's own weights, as llama.cpp's converter
would write a model of that architecture:

  * arch "qwen2" / "qwen3" / "smollm3", every "llama.*" key under the new name;
  * qwen2, qwen3: q's and k's rows in Hugging Face's order (the converter permutes them only for
    llama-style ropes, which pair adjacent dims; Qwen's, GPT-NeoX's, pairs i with
    i + head_dim / 2); smollm3 keeps llama's (its rope is llama's, left out of every fourth
    layer);
  * qwen2: q, k and v biases (attn_q.bias ...), qwen3: per-head q and k norms
    (attn_q_norm.weight ...), whose values are the formula in WAVE below, so the C test can write
    the same file without carrying 29,000 numbers.

llama.cpp (llama-cpp-python, fp32 weights dequantized from the Q4_1 file, an fp32 KV cache) runs
each file; its logits are recorded per prompt as tools/make-golden-head-dim.py records them (the
greedy continuation, the top-2 gap at each step, the top-5 logits at four positions), with how
far the plain llama model is from them. The C test (tests/test_model.c) writes the same files in
Q4_1, whose weights dequantize to exactly these fp32 values.

gemma3 (every "llama.*" key renamed, plus attention.sliding_window, rope.freq_base_swa and
final_logit_softcapping from its variant, no sliding_window_pattern: llama.cpp's default 6, layer
il local iff il % 6 < 5; q/k rows in Hugging Face's order; per layer q and k norms as qwen3's and
post_attention_norm / post_ffw_norm, wave kinds 3 and 4, all + 1 as a GGUF Gemma norm holds them)
is recorded from transformers' Gemma3ForCausalLM (fp32, eager attention) on the same file's
weights (each norm less 1), since llama.cpp's CPU GELU rounds through an fp16 table; llama.cpp's
run of the file is checked against it (within 2e-2 relative on the recorded top-5 logits, the
same greedy tokens) and its distance recorded as llamacpp_worst_rel_diff.

gemma2 the same way (attention.sliding_window, attn_logit_softcapping and
final_logit_softcapping from its variant; no sliding_window_pattern, llama.cpp's gemma2 default 2:
layer il local iff il % 2 < 1; no rope.freq_base_swa, its local layers keep rope.freq_base;
post_attention_norm / post_ffw_norm as gemma3's, no q/k norms), from transformers'
Gemma2ForCausalLM (fp32, eager attention: the implementation that applies the attention logit
softcap).

Run with the venv tools/make-golden.sh sets up:  .venv-golden/bin/python tools/make-golden-archs.py
"""
import json
import math
import os
import tempfile

import numpy as np

from golden_record import golden_cases, greedy_record
from importlib import import_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = os.path.join(ROOT, "tests", "golden", "smollm2.json")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2-archs.json")
N_NEW = 24
TOPK = 5
PROMPTS = ["chat-capital", "chat-code"]
# value(layer, kind, i) = AMP[kind] * sin(A * layer + B * kind + C * i) (+ 1 for a norm), in
# double, rounded to float32; kind 0 q, 1 k, 2 v; i the element in Hugging Face's order
WAVE = {"a": 0.7, "b": 1.3, "c": 0.37}
VARIANTS = [
    {"arch": "qwen2", "bias_amp": [0.5, 0.5, 0.1]},
    {"arch": "qwen3", "norm_amp": [0.25, 0.25]},
    {"arch": "smollm3"},
    {"arch": "phi3"},
    {"arch": "gemma3", "norm_amp": [0.25, 0.25], "post_norm_amp": [0.25, 0.25],
     "sliding_window": 16, "freq_base_swa": 10000.0, "final_logit_softcapping": 30.0},
    {"arch": "gemma2", "post_norm_amp": [0.25, 0.25], "sliding_window": 16,
     "attn_logit_softcapping": 5.0, "final_logit_softcapping": 30.0},
]
NEOX = {"qwen2", "qwen3", "phi3", "gemma3", "gemma2"}  # files with q/k rows in HF's order
FUSED = {"phi3"}  # q, k, v in one attn_qkv; ffn_up holds gate's rows, then up's
HF_REF = {"gemma3", "gemma2"}  # archs recorded from transformers (llama.cpp run beside as a check)


def wave(layer, kind, n, amp, offset=0.0):
    return np.array([offset + amp * math.sin(WAVE["a"] * layer + WAVE["b"] * kind + WAVE["c"] * i)
                     for i in range(n)], dtype=np.float32)


def hf_rows(w, n_heads):
    """GGUF llama rows (pairs adjacent) back to Hugging Face's order (pairs i, i + hd/2)."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def field_value(field):
    import gguf
    vt = field.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data], vt, sub
        return [field.parts[i].tolist()[0] for i in field.data], vt, sub
    if vt == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8"), vt, None
    return field.parts[field.data[0]].tolist()[0], vt, None


def write_variant(reader, var, path):
    import gguf
    arch = var["arch"]
    kv = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kv[name] = field_value(field)
    n_heads = kv["llama.attention.head_count"][0]
    n_kv = kv["llama.attention.head_count_kv"][0]
    n_layers = kv["llama.block_count"][0]
    w = gguf.GGUFWriter(path, arch)
    for name, (value, vt, sub) in kv.items():
        if name.startswith("llama."):
            name = arch + name[len("llama"):]
        if name == "general.file_type":
            value = 0  # all F32
        if name == "tokenizer.ggml.pre" and arch == "qwen2":
            value = "qwen2"  # Qwen2's pre-tokenizer over this vocabulary: digits one by one
        w.add_key_value(name, value, vt, sub_type=sub)
    # gemma3, gemma2: no sliding_window_pattern, llama.cpp's default (6 for gemma3, 2 for gemma2)
    if "sliding_window" in var:
        w.add_uint32(f"{arch}.attention.sliding_window", var["sliding_window"])
    if "freq_base_swa" in var:  # gemma2 has none: its local layers keep rope.freq_base
        w.add_float32(f"{arch}.rope.freq_base_swa", var["freq_base_swa"])
    if "attn_logit_softcapping" in var:
        w.add_float32(f"{arch}.attn_logit_softcapping", var["attn_logit_softcapping"])
    if "final_logit_softcapping" in var:
        w.add_float32(f"{arch}.final_logit_softcapping", var["final_logit_softcapping"])
    held = {}  # FUSED: the parts of each layer's fused tensors, until all are read
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        data = data.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else data
        if arch in NEOX and t.name.endswith("attn_q.weight"):
            data = hf_rows(data, n_heads)
        elif arch in NEOX and t.name.endswith("attn_k.weight"):
            data = hf_rows(data, n_kv)
        part = t.name.split(".")[2] if t.name.startswith("blk.") else None
        if arch in FUSED and part in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            layer = int(t.name.split(".")[1])
            held.setdefault(layer, {})[part] = data
            h = held[layer]
            if all(k in h for k in ("attn_q", "attn_k", "attn_v")) and "qkv" not in h:
                h["qkv"] = True
                w.add_tensor(f"blk.{layer}.attn_qkv.weight",
                             np.ascontiguousarray(np.concatenate([h["attn_q"], h["attn_k"],
                                                                  h["attn_v"]])))
            if all(k in h for k in ("ffn_gate", "ffn_up")) and "gu" not in h:
                h["gu"] = True
                w.add_tensor(f"blk.{layer}.ffn_up.weight",
                             np.ascontiguousarray(np.concatenate([h["ffn_gate"], h["ffn_up"]])))
            if part != "attn_v":
                continue
        else:
            w.add_tensor(t.name, np.ascontiguousarray(data))
        if t.name.endswith("attn_v.weight"):
            layer = int(t.name.split(".")[1])
            kv_dim = data.shape[0]
            hd = kv_dim // n_kv
            if "bias_amp" in var:
                amp = var["bias_amp"]
                w.add_tensor(f"blk.{layer}.attn_q.bias", wave(layer, 0, n_heads * hd, amp[0]))
                w.add_tensor(f"blk.{layer}.attn_k.bias", wave(layer, 1, kv_dim, amp[1]))
                w.add_tensor(f"blk.{layer}.attn_v.bias", wave(layer, 2, kv_dim, amp[2]))
            if "norm_amp" in var:
                amp = var["norm_amp"]
                w.add_tensor(f"blk.{layer}.attn_q_norm.weight", wave(layer, 0, hd, amp[0], 1.0))
                w.add_tensor(f"blk.{layer}.attn_k_norm.weight", wave(layer, 1, hd, amp[1], 1.0))
            if "post_norm_amp" in var:  # gemma3/2: RMS norms of the attention's and FFN's outputs
                amp = var["post_norm_amp"]
                dim = data.shape[1]
                w.add_tensor(f"blk.{layer}.post_attention_norm.weight",
                             wave(layer, 3, dim, amp[0], 1.0))
                w.add_tensor(f"blk.{layer}.post_ffw_norm.weight", wave(layer, 4, dim, amp[1], 1.0))
    assert sum(1 for t in reader.tensors if t.name.endswith("attn_v.weight")) == n_layers
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma_hf(path):
    """transformers' Gemma3ForCausalLM or Gemma2ForCausalLM (fp32, eager attention) holding the
    gemma3 or gemma2 file's weights, its config read from the file: layer il local (sliding
    window) iff il % 6 < 5 (gemma3) or il % 2 < 1 (gemma2), as llama.cpp's default patterns; each
    norm's weight the file's less 1 (Gemma3RMSNorm and Gemma2RMSNorm scale by 1 + w)."""
    import gguf
    import torch
    import transformers

    reader = gguf.GGUFReader(path)
    arch = field_value(reader.fields["general.architecture"])[0]
    assert arch in ("gemma3", "gemma2"), arch
    kv = {name[len(arch) + 1:]: field_value(f)[0] for name, f in reader.fields.items()
          if name.startswith(arch + ".")}
    T = {}
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        T[t.name] = data.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else data
    n_layers, dim = kv["block_count"], kv["embedding_length"]
    n_heads = kv["attention.head_count"]
    assert "attention.sliding_window_pattern" not in kv and "attention.key_length" not in kv
    pattern = 6 if arch == "gemma3" else 2  # llama.cpp's load_swa_pattern default
    layer_types = ["sliding_attention" if il % pattern < pattern - 1 else "full_attention"
                   for il in range(n_layers)]
    common = dict(
        vocab_size=T["token_embd.weight"].shape[0], hidden_size=dim,
        intermediate_size=kv["feed_forward_length"], num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=kv["attention.head_count_kv"],
        head_dim=dim // n_heads, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=kv["context_length"],
        rms_norm_eps=kv["attention.layer_norm_rms_epsilon"], tie_word_embeddings=True,
        query_pre_attn_scalar=dim // n_heads, sliding_window=kv["attention.sliding_window"],
        layer_types=layer_types, final_logit_softcapping=kv["final_logit_softcapping"],
        pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(
            rope_parameters={"full_attention": {"rope_type": "default",
                                                "rope_theta": kv["rope.freq_base"]},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": kv["rope.freq_base_swa"]}},
            attn_logit_softcapping=None, **common)
        model = transformers.Gemma3ForCausalLM._from_config(cfg, attn_implementation="eager",
                                                            dtype=torch.float32)
    else:  # one rope for every layer: llama.cpp's gemma2 reads no freq_base_swa here
        assert "rope.freq_base_swa" not in kv
        # transformers' own default layer types are llama.cpp's (layer 0 local): checked, then
        # given explicitly anyway
        assert transformers.Gemma2Config(num_hidden_layers=n_layers).layer_types == layer_types
        cfg = transformers.Gemma2Config(
            rope_parameters={"rope_type": "default", "rope_theta": kv["rope.freq_base"]},
            attn_logit_softcapping=kv["attn_logit_softcapping"], **common)
        model = transformers.Gemma2ForCausalLM._from_config(cfg, attn_implementation="eager",
                                                            dtype=torch.float32)
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
    if arch == "gemma3":  # Gemma 2 has no q/k norms
        names.update({"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"})
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
             **{f"blk.{il}.{g}": f"model.layers.{il}.{h}"
                for il in range(n_layers) for g, h in names.items()}}
    assert set(T) == {g + ".weight" for g in names}, sorted(set(T) ^ {g + ".weight" for g in names})
    hf = {}
    inexact = 0  # norm weights g that float32's 1 + (g - 1) does not give back (some |g| < 0.5)
    for g, h in names.items():
        v = T[g + ".weight"]
        if g.endswith("norm"):
            w = v - np.float32(1.0)
            inexact += int(np.sum(np.float32(1.0) + w != v))
            v = w
        hf[h + ".weight"] = v
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                                 for k, v in hf.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model.eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config._attn_implementation == "eager"
    assert float(model.model.embed_tokens.embed_scale) == math.sqrt(dim)
    assert model.model.layers[0].self_attn.scaling == (dim // n_heads) ** -0.5
    assert [la.self_attn.sliding_window for la in model.model.layers] == \
        [kv["attention.sliding_window"] if lt == "sliding_attention" else None
         for lt in layer_types]
    rot = model.model.rotary_emb
    if arch == "gemma3":
        for lt, base in (("full_attention", kv["rope.freq_base"]),
                         ("sliding_attention", kv["rope.freq_base_swa"])):
            want = 1.0 / base ** (np.arange(0, dim // n_heads, 2) / (dim // n_heads))
            got = getattr(rot, f"{lt}_inv_freq").numpy()
            assert np.allclose(got, want, rtol=1e-6), (lt, got[:4], want[:4])
    else:
        base = kv["rope.freq_base"]
        want = 1.0 / base ** (np.arange(0, dim // n_heads, 2) / (dim // n_heads))
        got = rot.inv_freq.numpy()
        assert np.allclose(got, want, rtol=1e-6), (got[:4], want[:4])
        assert all(la.self_attn.attn_logit_softcapping == kv["attn_logit_softcapping"]
                   for la in model.model.layers)
        # the norm scales by 1 + w, so by the file's own weight: x / rms(x) * g
        x = torch.randn(3, dim, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
        eps = kv["attention.layer_norm_rms_epsilon"]
        for g, norm in (("output_norm", model.model.norm),
                        ("blk.1.post_ffw_norm", model.model.layers[1].post_feedforward_layernorm)):
            want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * \
                torch.from_numpy(T[g + ".weight"])
            with torch.no_grad():
                assert torch.allclose(norm(x), want, rtol=1e-5, atol=1e-6), g
    return model, inexact


def softcap_bite(model, ids):
    """Gemma 2's attention logit cap at work in transformers' eager attention on ids: the largest
    uncapped score |q.k / 8| among the unmasked ones, the share beyond the cap, and how far the
    logits move with the cap taken away."""
    import torch
    from transformers.models.gemma2 import modeling_gemma2 as mg

    eager = mg.eager_attention_forward
    seen = {"max": 0.0, "over": 0, "n": 0}
    cap = model.config.attn_logit_softcapping

    def spy(module, query, key, value, attention_mask, scaling=None, softcap=None, **kw):
        assert softcap == cap  # what the eager implementation is handed, and applies
        k = mg.repeat_kv(key, module.num_key_value_groups)
        raw = torch.matmul(query, k.transpose(2, 3)) * scaling
        vis = attention_mask == 0 if attention_mask.dtype != torch.bool else attention_mask
        vis = vis.expand_as(raw)
        r = raw[vis].abs()
        seen["max"] = max(seen["max"], float(r.max()))
        seen["over"] += int((r > cap).sum())
        seen["n"] += int(r.numel())
        return eager(module, query, key, value, attention_mask, scaling=scaling, softcap=softcap,
                     **kw)

    mg.eager_attention_forward = spy
    try:
        with torch.no_grad():
            capped = model(torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        mg.eager_attention_forward = eager
    for la in model.model.layers:
        la.self_attn.attn_logit_softcapping = None
    try:
        with torch.no_grad():
            uncapped = model(torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        for la in model.model.layers:
            la.self_attn.attn_logit_softcapping = cap
    with torch.no_grad():
        again = model(torch.tensor([ids]), use_cache=False).logits[0]
    assert torch.equal(again, capped)
    return seen["max"], seen["over"] / seen["n"], float((capped - uncapped).abs().max())


def cpp_check(arch, pname, prompt, greedy, gaps, entries, logits_of, cpp_logits_of):
    """llama.cpp on the same file against transformers' record: the worst relative difference
    on the recorded top-5 logits (returned), on every position's top 5, and llama.cpp's own
    greedy continuation."""
    seq = prompt + greedy
    L, C = logits_of(seq), cpp_logits_of(seq)
    worst = max(abs(float(C[e["pos"]][t]) - v) / max(abs(v), 1.0)
                for e in entries for t, v in zip(e["top_ids"], e["top_logits"]))
    worst_all = 0.0
    for pos in range(len(seq)):
        for t in np.argsort(-L[pos], kind="stable")[:TOPK]:
            worst_all = max(worst_all, abs(float(C[pos][t]) - float(L[pos][t])) /
                            max(abs(float(L[pos][t])), 1.0))
    cpp_greedy = greedy_record(cpp_logits_of, prompt, len(greedy), (0,), TOPK)[0]
    same = next((i for i, (a, b) in enumerate(zip(greedy, cpp_greedy)) if a != b), None)
    print(f"{arch}-{pname}: llama.cpp vs transformers, worst relative top-5 logit difference "
          f"{worst:.2e} at the recorded positions, {worst_all:.2e} over all {len(seq)}; "
          f"max abs over the whole vocab {float(np.max(np.abs(C - L))):.3e}; greedy "
          + (f"the same {len(greedy)} tokens" if same is None else
             f"differs from step {same} (transformers' top-2 gap there {gaps[same]:.4f}): "
             f"{greedy[same:same + 4]} vs {cpp_greedy[same:same + 4]}"))
    assert worst < 2e-2, worst
    assert same is None, (greedy, cpp_greedy)
    return worst


def main():
    import gguf
    import llama_cpp
    import torch
    import transformers

    torch.set_num_threads(max(1, os.cpu_count() or 1))

    cases, sha = golden_cases(GOLDEN, os.path.join(MODEL_DIR, MODEL_FILE))
    reader = gguf.GGUFReader(os.path.join(MODEL_DIR, MODEL_FILE))

    def runner(path):
        llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=os.cpu_count(),
                              logits_all=True, type_k=0, type_v=0, flash_attn=False,
                              verbose=False)  # type 0: GGML_TYPE_F32 KV cache

        def logits_of(ids):
            llm.reset()
            llm.eval(ids)
            return np.array(llm.scores[:len(ids)], dtype=np.float32)
        return llm, logits_of

    tmp = tempfile.mkdtemp()
    plain_path = os.path.join(tmp, "llama-f32.gguf")
    write_variant(reader, {"arch": "llama"}, plain_path)  # no biases; rows as llama keeps them
    _, plain = runner(plain_path)
    for pname in PROMPTS:  # the pipeline itself: llama.cpp on the fp32 llama file against
        c = cases[pname]   # transformers' logits in smollm2.json
        ids = c["prompt_ids"] + c["greedy_ids"]
        L = plain(ids)
        worst = max(abs(float(L[e["pos"]][t]) - v) / max(abs(v), 1.0)
                    for e in c["logits"] for t, v in zip(e["top_ids"], e["top_logits"]))
        print(f"llama.cpp fp32 vs transformers on {pname}: worst relative logit error {worst:.2e}")
        assert worst < 1e-3, worst
    out = []
    tokenized = []
    for var in VARIANTS:
        path = os.path.join(tmp, var["arch"] + ".gguf")
        write_variant(reader, var, path)
        llm, logits_of = runner(path)
        cpp_logits_of = None
        if var["arch"] in HF_REF:  # llama.cpp's fp16-table GELU: transformers is the reference
            cpp_logits_of = logits_of
            model, inexact = gemma_hf(path)
            print(f"{var['arch']}: transformers' norm weights 1 + (w - 1) not exactly the "
                  f"file's: {inexact}")
            if var["arch"] == "gemma2":
                top, over, moved = softcap_bite(model, cases[PROMPTS[0]]["prompt_ids"])
                print(f"gemma2 on {PROMPTS[0]}'s prompt: uncapped attention scores up to "
                      f"{top:.2f}, {100 * over:.1f}% beyond the cap "
                      f"{var['attn_logit_softcapping']}; the cap moves the logits by up to "
                      f"{moved:.3f}")
                assert moved > 0.1, moved

            def logits_of(ids, model=model):
                with torch.no_grad():
                    return model(torch.tensor([ids], dtype=torch.long),
                                 use_cache=False).logits[0].float().numpy()
        if var["arch"] == "qwen2":  # llama.cpp's qwen2 pre-tokenizer, special tokens parsed
            for text in import_module("make-golden").TOKENIZE_STRINGS:
                ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
                tokenized.append({"text": text, "ids": [int(t) for t in ids]})
        for pname in PROMPTS:
            prompt = cases[pname]["prompt_ids"]
            greedy, gaps, entries, worst = greedy_record(logits_of, prompt, N_NEW, (0, 8, 16),
                                                         TOPK, other=plain)
            case = {"name": f"{var['arch']}-{pname}", "arch": var["arch"],
                    "prompt_ids": prompt, "greedy_ids": greedy, "top2_gap": gaps,
                    "logits": entries, "llama_worst_rel_diff": worst}
            if cpp_logits_of is not None:
                case["reference"] = "transformers"
                case["llamacpp_worst_rel_diff"] = cpp_check(var["arch"], pname, prompt, greedy,
                                                            gaps, entries, logits_of,
                                                            cpp_logits_of)
            out.append(case)
            print(f"{var['arch']}-{pname}: the llama model's worst relative top-5 logit "
                  f"difference {worst:.3f}; greedy {greedy[:8]}...")
        os.unlink(path)
    os.unlink(plain_path)
    os.rmdir(tmp)
    json.dump({"model_file": MODEL_FILE, "model_sha256": sha, "wave": WAVE, "variants": VARIANTS,
               "made_by": f"tools/make-golden-archs.py, llama-cpp-python {llama_cpp.__version__} "
                          f"(fp32 weights and KV cache), gguf-py {gguf.__version__ if hasattr(gguf, '__version__') else '?'}"
                          f"; gemma3, gemma2: transformers {transformers.__version__}, torch "
                          f"{torch.__version__} (fp32, eager attention)",
               "qwen2_tokenize": tokenized, "cases": out}, open(OUT, "w"), indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
