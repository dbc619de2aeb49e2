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

The mixture-of-experts copies, qwen3moe (qwen3's rows and q/k norms) and mixtral (GGUF arch
"llama" with expert keys, llama's rows; the variant's "name" names its cases), cut the dense FFN
into "experts" equal parts, an exact partition: expert e's gate and up are the dense gate's and
up's rows e * ff_e .. (e + 1) * ff_e - 1 (ffn_gate_exps / ffn_up_exps [E][ff_e][dim]), its down
the dense down's columns there (ffn_down_exps [E][dim][ff_e]), ff_e = feed_forward_length / E, so
the C test writes the same file from the Q4_1 bytes (down's column blocks of 32 fall inside one
expert). The router ffn_gate_inp [E][dim] is the wave formula, kind 5, amplitude router_amp, i
over all E * dim values row by row; expert_count E and expert_used_count (uint32); qwen3moe adds
expert_feed_forward_length ff_e and keeps feed_forward_length 1536 (which llama.cpp ignores for
MoE layers), mixtral's llama.feed_forward_length becomes ff_e, as Mixtral's GGUFs give the
expert's size there. Both are recorded from transformers (Qwen3MoeForCausalLM with
norm_topk_prob, MixtralForCausalLM; fp32, eager attention and the eager per-expert loop: softmax
over the E router logits, the top experts_used, their weights renormalized to sum 1, the sum of
weight * down(silu(gate x) * up x)), llama.cpp's run of the same file checked against it as for
gemma.

qwen2moe (Qwen1.5-MoE / Qwen2-MoE; qwen2's NeoX rows and q/k/v biases, wave kinds 0-2) adds a
shared expert: with shared_ff S, the dense FFN's first S channels are the shared expert
(ffn_gate_shexp / ffn_up_shexp [S][dim] the dense gate's/up's rows 0 .. S - 1, ffn_down_shexp
[dim][S] the dense down's columns there) and the rest the experts as above from channel S on
(ff_e = (feed_forward_length - S) / E; S absent is 0, as for qwen3moe and mixtral); the router is
kind 5 as above and the shared expert's gate ffn_gate_inp_shexp [dim] the wave formula, kind 6,
amplitude shared_gate_amp; keys expert_feed_forward_length ff_e and
expert_shared_feed_forward_length S (uint32), feed_forward_length 1536 kept, tokenizer.ggml.pre
as the file has it. Recorded from transformers' Qwen2MoeForCausalLM (norm_topk_prob false:
softmax over the E router logits, the top experts_used probabilities as they are, not
renormalized, summed over their experts, plus sigmoid(x . shared gate) * down(silu(gate x) * up x)
of the shared expert). llama.cpp's qwen2moe requires output.weight (it has no fallback to the tied
token_embd), so its run, the check, gets the copy plus output.weight = token_embd's values, the
same model.

granite and granitemoe (IBM Granite 3.x; GGUF arch "granite" / "granitemoe", every "llama.*" key
renamed, llama's q/k rows as the converter's GraniteModel, a LlamaModel, permutes them for
Granite's llama-style rope; no biases) add the variant's four scales as float32 keys:
ARCH.embedding_scale (the token embeddings times it), ARCH.residual_scale (the attention's and
the FFN's outputs times it before each residual add), ARCH.attention.scale (the q.k scale, in
place of 1/sqrt(head_dim)) and ARCH.logit_scale (the logits divided by it). granitemoe cuts the
FFN into experts as mixtral does (no shared expert, router kind 5), granitemoe.feed_forward_length
the expert's size ff_e (llama.cpp's granitemoe reads the experts' size there, where the converter
writes Granite MoE's intermediate_size; no expert_feed_forward_length), expert_count and
expert_used_count. Both recorded from transformers (GraniteForCausalLM, GraniteMoeForCausalLM;
fp32, eager attention and experts: softmax over the top experts_used router logits, the same as
softmax, top experts_used, renormalize), checked against a float64 computation from the file's
tensors (the embeddings, every layer from its own input, the logits), llama.cpp's run of the
same file checked against it as for gemma.

Run with the venv tools/make-golden.sh sets up:  .venv-golden/bin/python tools/make-golden-archs.py
(the whole takes ~17 minutes on 2 cores, granite and granitemoe about one more; `--only qwen2moe`
records just the variants named and merges their cases into the existing file, replacing those
variants' cases where they stood or appending them, every other case kept byte for byte)
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
    {"arch": "qwen3moe", "norm_amp": [0.25, 0.25], "experts": 4, "experts_used": 2,
     "router_amp": 0.1},
    {"arch": "llama", "name": "mixtral", "experts": 4, "experts_used": 2, "router_amp": 0.1},
    {"arch": "qwen2moe", "bias_amp": [0.5, 0.5, 0.1], "experts": 4, "experts_used": 2,
     "router_amp": 0.1, "shared_ff": 512, "shared_gate_amp": 0.1},
    {"arch": "granite", "embedding_scale": 12.0, "residual_scale": 0.22,
     "attention_scale": 0.0078125, "logit_scale": 8.0},
    {"arch": "granitemoe", "embedding_scale": 12.0, "residual_scale": 0.22,
     "attention_scale": 0.0078125, "logit_scale": 8.0, "experts": 4, "experts_used": 2,
     "router_amp": 0.1},
]
# q/k rows in HF's order
NEOX = {"qwen2", "qwen3", "phi3", "gemma3", "gemma2", "qwen3moe", "qwen2moe"}
FUSED = {"phi3"}  # q, k, v in one attn_qkv; ffn_up holds gate's rows, then up's
# variants (by name) recorded from transformers (llama.cpp run beside as a check)
HF_REF = {"gemma3", "gemma2", "qwen3moe", "mixtral", "qwen2moe", "granite", "granitemoe"}
GRANITE = {"granite", "granitemoe"}  # llama's rows and layout, plus the four scales below
# Granite's float32 keys (llama.cpp's LLM_KV_EMBEDDING_SCALE, LLM_KV_RESIDUAL_SCALE,
# LLM_KV_ATTENTION_SCALE, LLM_KV_LOGIT_SCALE) and the variant's keys that give them
GRANITE_KEYS = [("embedding_scale", "embedding_scale"), ("residual_scale", "residual_scale"),
                ("attention.scale", "attention_scale"), ("logit_scale", "logit_scale")]
# MoE archs whose feed_forward_length is the expert's size (Mixtral's GGUFs under "llama";
# granitemoe, whose converter writes Granite MoE's intermediate_size there): no
# expert_feed_forward_length; the others keep the dense 1536 and add that key
FF_IS_EXPERT = {"llama", "granitemoe"}
ROUTER_KIND = 5  # the wave kind of the MoE router ffn_gate_inp
SHEXP_GATE_KIND = 6  # the wave kind of the shared expert's gate ffn_gate_inp_shexp
# llama.cpp's qwen2moe requires output.weight (no fallback to token_embd): its run gets the copy
# with output.weight = token_embd's values, the same model as the tied copy
UNTIED_FOR_CPP = {"qwen2moe"}


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


def write_variant(reader, var, path, untie=False):
    """The copy of the default model (reader) that var describes, written to path as F32; untie:
    also output.weight, token_embd's values (for llama.cpp's qwen2moe, which requires it)."""
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
    ffn = kv["llama.feed_forward_length"][0]
    n_exp = var.get("experts", 0)
    n_sh = var.get("shared_ff", 0)  # the shared expert: the dense FFN's first n_sh channels
    ff_e = (ffn - n_sh) // n_exp if n_exp else 0
    assert not n_exp or ff_e * n_exp + n_sh == ffn, (ffn, n_exp, n_sh)
    assert not n_sh or n_exp, var
    w = gguf.GGUFWriter(path, arch)
    for name, (value, vt, sub) in kv.items():
        if name.startswith("llama."):
            name = arch + name[len("llama"):]
        if name == "general.file_type":
            value = 0  # all F32
        if name == f"{arch}.feed_forward_length" and n_exp and arch in FF_IS_EXPERT:
            value = ff_e  # Mixtral (arch llama), granitemoe: the expert's size
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
    for key, vkey in GRANITE_KEYS:
        if vkey in var:
            w.add_float32(f"{arch}.{key}", var[vkey])
    if n_exp:
        w.add_uint32(f"{arch}.expert_count", n_exp)
        w.add_uint32(f"{arch}.expert_used_count", var["experts_used"])
        if arch not in FF_IS_EXPERT:  # qwen3moe, qwen2moe; feed_forward_length the dense 1536
            w.add_uint32(f"{arch}.expert_feed_forward_length", ff_e)
        if n_sh:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", n_sh)
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
        elif n_exp and part in ("ffn_gate", "ffn_up", "ffn_down"):
            # the shared expert (channels 0 .. n_sh - 1) and the experts (the rest): an exact
            # partition of the dense FFN (gate/up rows, down columns)
            if part == "ffn_down":  # [dim][ffn] -> [dim][n_sh], [E][dim][ff_e]
                shared = data[:, :n_sh]
                data = data[:, n_sh:].reshape(data.shape[0], n_exp, ff_e).transpose(1, 0, 2)
            else:  # [ffn][dim] -> [n_sh][dim], [E][ff_e][dim]
                shared = data[:n_sh]
                data = data[n_sh:].reshape(n_exp, ff_e, data.shape[1])
            if n_sh:
                w.add_tensor(t.name.replace(f".{part}.", f".{part}_shexp."),
                             np.ascontiguousarray(shared))
            w.add_tensor(t.name.replace(f".{part}.", f".{part}_exps."), np.ascontiguousarray(data))
            continue
        else:
            w.add_tensor(t.name, np.ascontiguousarray(data))
            if untie and t.name == "token_embd.weight":
                assert not any(u.name == "output.weight" for u in reader.tensors)
                w.add_tensor("output.weight", np.ascontiguousarray(data))
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
            if n_exp:  # the router, [E][dim]
                dim = data.shape[1]
                w.add_tensor(f"blk.{layer}.ffn_gate_inp.weight",
                             wave(layer, ROUTER_KIND, n_exp * dim, var["router_amp"])
                             .reshape(n_exp, dim))
            if n_sh:  # the shared expert's gate, [dim] (llama.cpp: {n_embd})
                w.add_tensor(f"blk.{layer}.ffn_gate_inp_shexp.weight",
                             wave(layer, SHEXP_GATE_KIND, data.shape[1], var["shared_gate_amp"]))
    assert sum(1 for t in reader.tensors if t.name.endswith("attn_v.weight")) == n_layers
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_copy(path):
    """A copy's architecture, its ARCH.* keys (without the prefix) and its tensors as float32
    arrays in [rows][cols] (numpy's order)."""
    import gguf
    reader = gguf.GGUFReader(path)
    arch = field_value(reader.fields["general.architecture"])[0]
    kv = {k[len(arch) + 1:]: field_value(f)[0] for k, f in reader.fields.items()
          if k.startswith(arch + ".")}
    T = {}
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        T[t.name] = data.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else data
    return arch, kv, T


def gemma_hf(path):
    """transformers' Gemma3ForCausalLM or Gemma2ForCausalLM (fp32, eager attention) holding the
    gemma3 or gemma2 file's weights, its config read from the file: layer il local (sliding
    window) iff il % 6 < 5 (gemma3) or il % 2 < 1 (gemma2), as llama.cpp's default patterns; each
    norm's weight the file's less 1 (Gemma3RMSNorm and Gemma2RMSNorm scale by 1 + w)."""
    import gguf
    import torch
    import transformers

    arch, kv, T = read_copy(path)
    assert arch in ("gemma3", "gemma2"), arch
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


def check_partition(reader0, T, n_exp, ff_e, n_sh, dim):
    """The shared expert (n_sh channels, or none) and the experts of a copy's tensors T side by
    side are the dense FFN of reader0 (the default model), bit for bit."""
    import gguf
    for t in reader0.tensors:
        part = t.name.split(".")[2] if t.name.startswith("blk.") else None
        if part not in ("ffn_gate", "ffn_up", "ffn_down"):
            continue
        dense = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        dense = dense.reshape([int(x) for x in reversed(t.shape)])
        e = T[t.name.replace(f".{part}.", f".{part}_exps.")]
        sh = [T[t.name.replace(f".{part}.", f".{part}_shexp.")]] if n_sh else []
        if part == "ffn_down":
            assert e.shape == (n_exp, dim, ff_e) and all(x.shape == (dim, n_sh) for x in sh)
            assert np.array_equal(np.concatenate(sh + list(e), axis=1), dense), t.name
        else:
            assert e.shape == (n_exp, ff_e, dim) and all(x.shape == (n_sh, dim) for x in sh)
            assert np.array_equal(np.concatenate(sh + list(e), axis=0), dense), t.name


def moe_hf(path, name, reader0):
    """transformers' Qwen3MoeForCausalLM (name "qwen3moe"), MixtralForCausalLM ("mixtral") or
    Qwen2MoeForCausalLM ("qwen2moe") holding the MoE file's weights (fp32, eager attention, the
    eager per-expert loop), its config read from the file. Each expert's gate and up go into
    experts.gate_up_proj [E][2 * ff_e][dim] (gate's rows, then up's: the eager loop's chunk(2)
    takes gate first), its down into experts.down_proj [E][dim][ff_e], the router into
    mlp.gate.weight [E][dim]; mixtral's q and k rows back to Hugging Face's order; qwen2moe's
    shared expert into mlp.shared_expert.{gate,up,down}_proj, its gate into
    mlp.shared_expert_gate.weight [1][dim], its q/k/v biases into self_attn.{q,k,v}_proj.bias.
    Checks against reader0 (the default model) that the shared expert and the experts are an
    exact partition of the dense FFN, and on random inputs that one layer's MoE block is softmax
    over the E router logits, the top experts_used, renormalized (not for qwen2moe), summed, plus
    (qwen2moe) sigmoid(x . shared gate) times the shared expert."""
    import gguf
    import torch
    import transformers

    arch, kv, T = read_copy(path)
    assert (arch, name) in (("qwen3moe", "qwen3moe"), ("llama", "mixtral"),
                            ("qwen2moe", "qwen2moe")), (arch, name)
    n_layers, dim = kv["block_count"], kv["embedding_length"]
    n_heads, n_kv = kv["attention.head_count"], kv["attention.head_count_kv"]
    n_exp, used = kv["expert_count"], kv["expert_used_count"]
    ff_e = kv["expert_feed_forward_length"] if arch != "llama" else kv["feed_forward_length"]
    n_sh = kv.get("expert_shared_feed_forward_length", 0)
    assert "attention.key_length" not in kv and (n_sh > 0) == (name == "qwen2moe"), (name, n_sh)
    check_partition(reader0, T, n_exp, ff_e, n_sh, dim)
    common = dict(
        vocab_size=T["token_embd.weight"].shape[0], hidden_size=dim, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=dim // n_heads,
        hidden_act="silu", max_position_embeddings=kv["context_length"],
        rms_norm_eps=kv["attention.layer_norm_rms_epsilon"], tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": kv["rope.freq_base"]},
        num_experts_per_tok=used, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if name == "qwen3moe":
        cfg = transformers.Qwen3MoeConfig(
            num_experts=n_exp, moe_intermediate_size=ff_e,
            intermediate_size=kv["feed_forward_length"], norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
            use_sliding_window=False, **common)
        cls, block = transformers.Qwen3MoeForCausalLM, "Qwen3MoeSparseMoeBlock"
    elif name == "qwen2moe":
        cfg = transformers.Qwen2MoeConfig(
            num_experts=n_exp, moe_intermediate_size=ff_e, shared_expert_intermediate_size=n_sh,
            intermediate_size=kv["feed_forward_length"], norm_topk_prob=False,
            decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True, use_sliding_window=False,
            **common)
        cls, block = transformers.Qwen2MoeForCausalLM, "Qwen2MoeSparseMoeBlock"
    else:
        cfg = transformers.MixtralConfig(
            num_local_experts=n_exp, intermediate_size=ff_e, sliding_window=None,
            router_jitter_noise=0.0, **common)
        cls, block = transformers.MixtralForCausalLM, "MixtralSparseMoeBlock"
    model = cls._from_config(cfg, attn_implementation="eager", experts_implementation="eager",
                             dtype=torch.float32)
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "ffn_gate_inp": "mlp.gate"}
    if name == "qwen3moe":
        names.update({"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"})
    biases = {}
    if name == "qwen2moe":
        names.update({"ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                      "ffn_up_shexp": "mlp.shared_expert.up_proj",
                      "ffn_down_shexp": "mlp.shared_expert.down_proj",
                      "ffn_gate_inp_shexp": "mlp.shared_expert_gate"})
        biases = {f"blk.{il}.attn_{x}.bias": f"model.layers.{il}.self_attn.{x}_proj.bias"
                  for il in range(n_layers) for x in "qkv"}
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
             **{f"blk.{il}.{g}": f"model.layers.{il}.{h}"
                for il in range(n_layers) for g, h in names.items()}}
    exps = {f"blk.{il}.ffn_{p}_exps" for il in range(n_layers) for p in ("gate", "up", "down")}
    expect = {g + ".weight" for g in list(names) + list(exps)} | set(biases)
    assert set(T) == expect, sorted(set(T) ^ expect)
    hf = {}
    for g, h in names.items():
        v = T[g + ".weight"]
        if name == "mixtral" and g.endswith(".attn_q"):
            v = hf_rows(v, n_heads)
        elif name == "mixtral" and g.endswith(".attn_k"):
            v = hf_rows(v, n_kv)
        elif g.endswith(".ffn_gate_inp_shexp"):  # the file's [dim], a Linear(dim, 1)'s [1][dim]
            assert v.shape == (dim,)
            v = v.reshape(1, dim)
        hf[h + ".weight"] = v
    for g, h in biases.items():
        hf[h] = T[g]
    for il in range(n_layers):
        b = f"blk.{il}.ffn_"
        hf[f"model.layers.{il}.mlp.experts.gate_up_proj"] = np.concatenate(
            [T[b + "gate_exps.weight"], T[b + "up_exps.weight"]], axis=1)
        hf[f"model.layers.{il}.mlp.experts.down_proj"] = T[b + "down_exps.weight"]
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                                 for k, v in hf.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model.eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config._attn_implementation == "eager"
    assert model.config._experts_implementation == "eager"
    assert all(type(la.mlp).__name__ == block for la in model.model.layers)
    assert all(la.mlp.gate.top_k == used and la.mlp.experts.num_experts == n_exp
               for la in model.model.layers)
    assert model.model.layers[0].self_attn.scaling == (dim // n_heads) ** -0.5
    if name == "qwen3moe":
        assert all(la.mlp.gate.norm_topk_prob for la in model.model.layers)
    elif name == "qwen2moe":
        assert not any(la.mlp.gate.norm_topk_prob for la in model.model.layers)
        assert all(la.mlp.shared_expert.intermediate_size == n_sh and
                   tuple(la.mlp.shared_expert_gate.weight.shape) == (1, dim) and
                   la.mlp.shared_expert_gate.bias is None and
                   all(getattr(la.self_attn, f"{x}_proj").bias is not None for x in "qkv") and
                   not hasattr(la.self_attn, "sliding_window") for la in model.model.layers)
        assert set(model.config.layer_types) == {"full_attention"}
    else:
        assert model.config.sliding_window is None
        assert all(la.mlp.jitter_noise == 0.0 for la in model.model.layers)
    base = kv["rope.freq_base"]
    want = 1.0 / base ** (np.arange(0, dim // n_heads, 2) / (dim // n_heads))
    got = model.model.rotary_emb.inv_freq.numpy()
    assert np.allclose(got, want, rtol=1e-6), (got[:4], want[:4])
    # the MoE block is softmax, top experts_used, renormalize (not qwen2moe), sum of weight *
    # expert(x) (qwen2moe: + sigmoid(x . shared gate) * shared(x)): layer 1's on random inputs
    # against the same computed here in float64 from the file's tensors; and against the
    # variations (renormalized or not, the shared expert ungated) to show the check tells them
    # apart
    x = torch.randn(7, dim, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model.model.layers[1].mlp(x[None])[0].numpy().astype(np.float64)
    xd = x.numpy().astype(np.float64)
    router = T["blk.1.ffn_gate_inp.weight"].astype(np.float64)
    g_e, u_e, d_e = (T[f"blk.1.ffn_{p}_exps.weight"].astype(np.float64)
                     for p in ("gate", "up", "down"))

    def ffn(g, u, d, v):
        gx = g @ v
        return d @ (gx / (1 + np.exp(-gx)) * (u @ v))
    norm = name != "qwen2moe"
    ref, alt_norm, alt_gate = (np.zeros_like(xd) for _ in range(3))
    for n in range(len(xd)):
        logit = router @ xd[n]
        p = np.exp(logit - logit.max())
        p /= p.sum()
        top = np.argsort(-p, kind="stable")[:used]
        for e in top:
            y = ffn(g_e[e], u_e[e], d_e[e], xd[n])
            ref[n] += (p[e] / p[top].sum() if norm else p[e]) * y
            alt_norm[n] += (p[e] if norm else p[e] / p[top].sum()) * y
        alt_gate[n] = ref[n]
        if n_sh:
            sh = ffn(*(T[f"blk.1.ffn_{q}_shexp.weight"].astype(np.float64)
                       for q in ("gate", "up", "down")), xd[n])
            sg = T["blk.1.ffn_gate_inp_shexp.weight"].astype(np.float64) @ xd[n]
            ref[n] += sh / (1 + np.exp(-sg))
            alt_norm[n] += sh / (1 + np.exp(-sg))
            alt_gate[n] += sh
    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    off = [float(np.max(np.abs(got - a)) / np.max(np.abs(ref))) for a in (alt_norm, alt_gate)]
    print(f"{name}: layer 1's MoE block {err:.2e} from the float64 computation; "
          f"{off[0]:.2e} from it with the routing weights " +
          ("not renormalized" if norm else "renormalized") +
          (f", {off[1]:.2e} with the shared expert ungated" if n_sh else ""))
    assert err < 1e-5 and off[0] > 1e-2 and (not n_sh or off[1] > 1e-2), (err, off)
    return model, err


def granite_layer64(T, kv, il, h, att_scale=None, res_scale=None, renorm=True):
    """Layer il of the granite / granitemoe copy (its tensors T, keys kv) on h [n][dim] (the
    sequence at positions 0 .. n - 1) in float64, straight from the file: llama's rope on the
    GGUF rows (pairs 2j, 2j + 1 at base^(-2j / head_dim)), the q.k scale attention.scale, causal
    softmax, h1 = h + residual_scale * attention, out = h1 + residual_scale * FFN(rms(h1)), the
    FFN dense, or softmax over the router logits, the top expert_used_count, renormalized
    (renorm), summed. att_scale, res_scale, renorm: variations, to show the check sees them."""
    att_scale = kv["attention.scale"] if att_scale is None else att_scale
    res_scale = kv["residual_scale"] if res_scale is None else res_scale
    eps = kv["attention.layer_norm_rms_epsilon"]
    n_heads, n_kv = kv["attention.head_count"], kv["attention.head_count_kv"]
    n, dim = h.shape
    hd = dim // n_heads

    def W(part):
        return T[f"blk.{il}.{part}.weight"].astype(np.float64)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def silu(x):
        return x / (1 + np.exp(-x))

    def rope(x):  # [n][heads][hd], GGUF (llama) rows: adjacent pairs
        theta = kv["rope.freq_base"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.arange(n, dtype=np.float64)[:, None] * theta[None, :]  # [n][hd / 2]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    a = rms(h, W("attn_norm"))
    q = rope((a @ W("attn_q").T).reshape(n, n_heads, hd))
    k = rope((a @ W("attn_k").T).reshape(n, n_kv, hd))
    v = (a @ W("attn_v").T).reshape(n, n_kv, hd)
    o = np.zeros((n, n_heads, hd))
    for hh in range(n_heads):
        kh = hh // (n_heads // n_kv)
        sc = (q[:, hh] @ k[:, kh].T) * att_scale
        sc = np.where(np.tril(np.ones((n, n), dtype=bool)), sc, -np.inf)
        p = np.exp(sc - sc.max(axis=-1, keepdims=True))
        o[:, hh] = (p / p.sum(axis=-1, keepdims=True)) @ v[:, kh]
    h1 = h + res_scale * (o.reshape(n, dim) @ W("attn_output").T)
    f = rms(h1, W("ffn_norm"))
    if "expert_count" not in kv:
        ffn = (silu(f @ W("ffn_gate").T) * (f @ W("ffn_up").T)) @ W("ffn_down").T
    else:
        used = kv["expert_used_count"]
        g_e, u_e, d_e = (W(f"ffn_{x}_exps") for x in ("gate", "up", "down"))
        ffn = np.zeros_like(f)
        for t in range(n):
            logit = W("ffn_gate_inp") @ f[t]
            p = np.exp(logit - logit.max())
            p /= p.sum()
            top = np.argsort(-p, kind="stable")[:used]
            for e in top:
                y = d_e[e] @ (silu(g_e[e] @ f[t]) * (u_e[e] @ f[t]))
                ffn[t] += (p[e] / p[top].sum() if renorm else p[e]) * y
    return h1 + res_scale * ffn


def granite_hf(path, reader0, ids):
    """transformers' GraniteForCausalLM (the granite copy) or GraniteMoeForCausalLM (granitemoe)
    holding the file's weights (fp32, eager attention; eager experts), its config read from the
    file: embedding_multiplier, residual_multiplier, attention_multiplier and logits_scaling the
    file's embedding_scale, residual_scale, attention.scale and logit_scale; q's and k's rows back
    to Hugging Face's order. granitemoe: each expert's gate and up into
    block_sparse_moe.experts.gate_up_proj [E][2 * ff_e][dim] (gate's rows, then up's: the eager
    loop's chunk(2) puts the first half through the activation), its down into
    block_sparse_moe.experts.down_proj [E][dim][ff_e], the router into
    block_sparse_moe.router.weight [E][dim] (transformers' conversion mapping renames the
    checkpoints' input_linear / output_linear / router.layer to these). Checks, on the model run
    over ids: the embeddings it feeds layer 0 are token_embd's rows times embedding_scale, bit for
    bit; every layer's output from its own input against granite_layer64 (float64, from the
    file's tensors; and that the check tells apart the scales left out and, for granitemoe, the
    routing weights not renormalized); the logits against rms(last layer) . token_embd /
    logit_scale in float64. Returns the model and the worst layer's relative error."""
    import gguf
    import torch
    import transformers

    arch, kv, T = read_copy(path)
    assert arch in GRANITE, arch
    n_layers, dim = kv["block_count"], kv["embedding_length"]
    n_heads, n_kv = kv["attention.head_count"], kv["attention.head_count_kv"]
    moe = arch == "granitemoe"
    n_exp, used = kv.get("expert_count", 0), kv.get("expert_used_count", 0)
    ff = kv["feed_forward_length"]  # granitemoe: the expert's size, as llama.cpp reads it
    assert (n_exp > 0) == moe and "expert_feed_forward_length" not in kv, kv
    assert "attention.key_length" not in kv and "expert_shared_feed_forward_length" not in kv
    if moe:
        check_partition(reader0, T, n_exp, ff, 0, dim)
    common = dict(
        vocab_size=T["token_embd.weight"].shape[0], hidden_size=dim, intermediate_size=ff,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv,
        hidden_act="silu", max_position_embeddings=kv["context_length"],
        rms_norm_eps=kv["attention.layer_norm_rms_epsilon"], tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": kv["rope.freq_base"]},
        attention_bias=False, embedding_multiplier=kv["embedding_scale"],
        residual_multiplier=kv["residual_scale"], attention_multiplier=kv["attention.scale"],
        logits_scaling=kv["logit_scale"], pad_token_id=None, bos_token_id=None,
        eos_token_id=None)
    if moe:
        cfg = transformers.GraniteMoeConfig(num_local_experts=n_exp, num_experts_per_tok=used,
                                            **common)
        model = transformers.GraniteMoeForCausalLM._from_config(
            cfg, attn_implementation="eager", experts_implementation="eager",
            dtype=torch.float32)
    else:
        cfg = transformers.GraniteConfig(mlp_bias=False, **common)
        model = transformers.GraniteForCausalLM._from_config(cfg, attn_implementation="eager",
                                                             dtype=torch.float32)
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    if moe:
        names["ffn_gate_inp"] = "block_sparse_moe.router"
    else:
        names.update({"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                      "ffn_down": "mlp.down_proj"})
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
             **{f"blk.{il}.{g}": f"model.layers.{il}.{h}"
                for il in range(n_layers) for g, h in names.items()}}
    exps = {f"blk.{il}.ffn_{p}_exps" for il in range(n_layers) for p in ("gate", "up", "down")
            } if moe else set()
    expect = {g + ".weight" for g in list(names) + list(exps)}
    assert set(T) == expect, sorted(set(T) ^ expect)
    hf = {}
    for g, h in names.items():
        v = T[g + ".weight"]
        if g.endswith(".attn_q"):
            v = hf_rows(v, n_heads)
        elif g.endswith(".attn_k"):
            v = hf_rows(v, n_kv)
        hf[h + ".weight"] = v
    for il in range(n_layers if moe else 0):
        b, m = f"blk.{il}.ffn_", f"model.layers.{il}.block_sparse_moe.experts."
        hf[m + "gate_up_proj"] = np.concatenate([T[b + "gate_exps.weight"],
                                                 T[b + "up_exps.weight"]], axis=1)
        hf[m + "down_proj"] = T[b + "down_exps.weight"]
    assert set(hf) | {"lm_head.weight"} == set(model.state_dict()), \
        sorted(set(hf) ^ set(model.state_dict()))
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                                 for k, v in hf.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model.eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config._attn_implementation == "eager"
    f32 = [float(np.float32(kv[k])) for k in ("embedding_scale", "residual_scale",
                                               "attention.scale", "logit_scale")]
    assert [model.model.embedding_multiplier, model.config.residual_multiplier,
            model.config.attention_multiplier, model.config.logits_scaling] == f32
    assert all(la.residual_multiplier == f32[1] and la.self_attn.scaling == f32[2]
               for la in model.model.layers)
    if moe:
        assert model.config._experts_implementation == "eager"
        assert all(type(la.block_sparse_moe).__name__ == "GraniteMoeMoE" and
                   la.block_sparse_moe.router.top_k == used and
                   la.block_sparse_moe.experts.num_experts == n_exp and
                   la.block_sparse_moe.experts.intermediate_dim == ff
                   for la in model.model.layers)
    else:
        assert all(type(la.mlp).__name__ == "GraniteMLP" and la.mlp.intermediate_size == ff
                   for la in model.model.layers)
    hd = dim // n_heads
    want = 1.0 / kv["rope.freq_base"] ** (np.arange(0, hd, 2) / hd)
    got = model.model.rotary_emb.inv_freq.numpy()
    assert np.allclose(got, want, rtol=1e-6), (got[:4], want[:4])
    # the model at work on ids: each layer's input and output, the final norm's input
    seen = {}

    def keep(key):
        def hook(mod, args, kwargs, out):
            x = args[0] if args else kwargs["hidden_states"]
            seen[key] = (x[0].detach().numpy().copy(),
                         (out[0] if isinstance(out, tuple) else out)[0].detach().numpy().copy())
        return hook
    hooks = [la.register_forward_hook(keep(il), with_kwargs=True)
             for il, la in enumerate(model.model.layers)]
    hooks.append(model.model.norm.register_forward_hook(keep("norm"), with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    finally:
        for h in hooks:
            h.remove()
    emb = T["token_embd.weight"][ids]
    assert np.array_equal(seen[0][0], emb * np.float32(kv["embedding_scale"]))
    assert not np.array_equal(seen[0][0], emb)
    worst, worst_at = 0.0, None
    alts = {"attention.scale 1/sqrt(head_dim)": dict(att_scale=hd ** -0.5),
            "no residual_scale": dict(res_scale=1.0)}
    if moe:
        alts["the routing weights not renormalized"] = dict(renorm=False)
    alt_off = {k: 0.0 for k in alts}
    for il in range(n_layers):
        x, y = (a.astype(np.float64) for a in seen[il])
        ref = granite_layer64(T, kv, il, x)
        # relative to the layer's largest output (the residual stream included: the dense copy's
        # carries some 5450 in one channel from layer 11 on, and the fp32 output's rounding there
        # is 2.4e-4 .. 4.9e-4, more than the layer's own change elsewhere tells)
        scale = np.max(np.abs(ref))
        err = float(np.max(np.abs(y - ref)) / scale)
        if err > worst:
            worst, worst_at = err, il
        for k, a in alts.items():
            off = np.max(np.abs(y - granite_layer64(T, kv, il, x, **a))) / scale
            alt_off[k] = max(alt_off[k], float(off))
    xn = seen["norm"][0].astype(np.float64)
    eps = kv["attention.layer_norm_rms_epsilon"]
    ref = (xn / np.sqrt(np.mean(xn * xn, axis=-1, keepdims=True) + eps) *
           T["output_norm.weight"]) @ T["token_embd.weight"].astype(np.float64).T
    ref /= kv["logit_scale"]
    lerr = float(np.max(np.abs(logits - ref)) / np.max(np.abs(ref)))
    print(f"{arch}: " + (f"the experts are the dense FFN cut in {n_exp}, bit for bit; "
                         if moe else "") +
          f"transformers on {len(ids)} tokens against float64 from the file: embeddings "
          f"times {kv['embedding_scale']} bit for bit; each layer's output from its input "
          f"{worst:.2e} at the most (layer {worst_at}), relative to its largest output; "
          + "; ".join(f"with {k} {v:.2e}" for k, v in alt_off.items())
          + f"; the logits (divided by {kv['logit_scale']}) {lerr:.2e} relative")
    assert worst < 1e-5 and lerr < 1e-5 and min(alt_off.values()) > 1e-2, (worst, lerr, alt_off)
    return model, worst


def moe_router(layer):
    """A decoder layer's router, whose output's [0] is the router logits [tokens][E]:
    mlp.gate (Qwen3Moe, Mixtral, Qwen2Moe), block_sparse_moe.router (GraniteMoe)."""
    return layer.mlp.gate if hasattr(layer, "mlp") else layer.block_sparse_moe.router


def route_stats(model, ids):
    """The router at work in transformers' model on ids: per (token, layer) its logits; the share
    of each top-experts_used set, how often the set changes from one layer to the next (same
    token) and from one token to the next (same layer), and the smallest gap between the
    experts_used-th and the next router logit (absolute, and relative to the row's largest
    |logit|)."""
    import torch

    used = model.config.num_experts_per_tok
    rows = []
    hooks = [moe_router(la).register_forward_hook(
        lambda mod, inp, out, il=il: rows.append((il, out[0].detach().numpy().copy())))
        for il, la in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    assert [il for il, _ in rows] == list(range(len(model.model.layers)))
    R = np.stack([r for _, r in rows], axis=1)  # [token][layer][expert]
    order = np.argsort(-R, axis=-1, kind="stable")
    sets = np.sort(order[..., :used], axis=-1)
    n_tok, n_lay = sets.shape[:2]
    share = {}
    for t in range(n_tok):
        for il in range(n_lay):
            share[tuple(int(e) for e in sets[t, il])] = share.get(
                tuple(int(e) for e in sets[t, il]), 0) + 1
    share = {k: v / (n_tok * n_lay) for k, v in sorted(share.items())}
    layer_change = float(np.mean(np.any(sets[:, 1:] != sets[:, :-1], axis=-1)))
    token_change = float(np.mean(np.any(sets[1:] != sets[:-1], axis=-1)))
    srt = -np.sort(-R, axis=-1)
    gap = srt[..., used - 1] - srt[..., used]
    rel = gap / np.max(np.abs(R), axis=-1)
    t, il = np.unravel_index(np.argmin(gap), gap.shape)
    tr, ilr = np.unravel_index(np.argmin(rel), rel.shape)
    return {"share": share, "layer_change": layer_change, "token_change": token_change,
            "min_gap": float(gap[t, il]), "min_gap_at": (int(t), int(il)),
            "min_rel_gap": float(rel[tr, ilr]), "min_rel_gap_at": (int(tr), int(ilr)),
            "logit_range": (float(R.min()), float(R.max())),
            "top1_share": [float(np.mean(order[..., 0] == e)) for e in range(R.shape[-1])]}


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


def variant_name(var):
    return var.get("name", var["arch"])


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", metavar="VARIANT",
                    help="record just these variants (by name: " +
                    ", ".join(variant_name(v) for v in VARIANTS) + ") and merge their cases into "
                    "the existing file: a variant's cases replace its old ones where they stood, "
                    "or are appended; every other case is kept as it is")
    args = ap.parse_args(argv)
    selected = VARIANTS
    if args.only:
        unknown = set(args.only) - {variant_name(v) for v in VARIANTS}
        if unknown:
            ap.error(f"no such variant: {', '.join(sorted(unknown))}")
        selected = [v for v in VARIANTS if variant_name(v) in args.only]

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
    for var in selected:
        vname = variant_name(var)
        path = os.path.join(tmp, vname + ".gguf")
        write_variant(reader, var, path)
        cpp_path = path
        if var["arch"] in UNTIED_FOR_CPP:  # llama.cpp's run: the copy plus output.weight
            cpp_path = os.path.join(tmp, vname + "-untied.gguf")
            write_variant(reader, var, cpp_path, untie=True)
        llm, logits_of = runner(cpp_path)
        cpp_logits_of = None
        if var["arch"] in GRANITE:  # granite, granitemoe: transformers is the reference
            cpp_logits_of = logits_of
            model, err = granite_hf(path, reader, cases[PROMPTS[0]]["prompt_ids"])

            def logits_of(ids, model=model):
                with torch.no_grad():
                    return model(torch.tensor([ids], dtype=torch.long),
                                 use_cache=False).logits[0].float().numpy()
        elif vname in HF_REF and "experts" in var:  # MoE: transformers is the reference
            cpp_logits_of = logits_of
            model, err = moe_hf(path, vname, reader)
            print(f"{vname}: the experts are the dense FFN cut in {var['experts']}"
                  + (f" after a shared expert of {var['shared_ff']}" if "shared_ff" in var else "")
                  + f"; layer 1's MoE block against softmax/top-{var['experts_used']}/"
                  + ("renormalize/sum" if "shared_ff" not in var else
                     "sum (not renormalized) + sigmoid-gated shared expert")
                  + f" in float64: {err:.2e} relative")

            def logits_of(ids, model=model):
                with torch.no_grad():
                    return model(torch.tensor([ids], dtype=torch.long),
                                 use_cache=False).logits[0].float().numpy()
        elif vname in HF_REF:  # llama.cpp's fp16-table GELU: transformers is the reference
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
            case = {"name": f"{vname}-{pname}", "arch": var["arch"], "variant": vname,
                    "prompt_ids": prompt, "greedy_ids": greedy, "top2_gap": gaps,
                    "logits": entries, "llama_worst_rel_diff": worst}
            if cpp_logits_of is not None:
                case["reference"] = "transformers"
                case["llamacpp_worst_rel_diff"] = cpp_check(vname, pname, prompt, greedy,
                                                            gaps, entries, logits_of,
                                                            cpp_logits_of)
            if "experts" in var:  # on the sequence recorded (prompt and greedy tokens)
                st = route_stats(model, prompt + greedy)
                print(f"{vname}-{pname} routing ({len(prompt + greedy)} tokens x "
                      f"{len(model.model.layers)} layers): top-{var['experts_used']} sets "
                      + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in st["share"].items())
                      + "; top-1 per expert "
                      + ", ".join(f"{100 * v:.1f}%" for v in st["top1_share"])
                      + f"; the set changes layer to layer {100 * st['layer_change']:.1f}%, "
                      f"token to token {100 * st['token_change']:.1f}%; router logits "
                      f"{st['logit_range'][0]:.3f}..{st['logit_range'][1]:.3f}; smallest gap "
                      f"between router logits {var['experts_used']} and {var['experts_used'] + 1}"
                      f" {st['min_gap']:.3e} at (token, layer) {st['min_gap_at']}, relative to "
                      f"the row's largest |logit| {st['min_rel_gap']:.3e} at "
                      f"{st['min_rel_gap_at']}" + (" NEAR-TIE" if st["min_rel_gap"] < 1e-4 else ""))
            out.append(case)
            print(f"{vname}-{pname}: the llama model's worst relative top-5 logit "
                  f"difference {worst:.3f}; greedy {greedy[:8]}...")
        os.unlink(path)
        if cpp_path != path:
            os.unlink(cpp_path)
    os.unlink(plain_path)
    os.rmdir(tmp)
    made_by = (f"tools/make-golden-archs.py, llama-cpp-python {llama_cpp.__version__} "
               f"(fp32 weights and KV cache), gguf-py {gguf.__version__ if hasattr(gguf, '__version__') else '?'}"
               f"; gemma3, gemma2, qwen3moe (Qwen3MoeForCausalLM), mixtral "
               f"(MixtralForCausalLM), qwen2moe (Qwen2MoeForCausalLM), granite "
               f"(GraniteForCausalLM), granitemoe (GraniteMoeForCausalLM): transformers "
               f"{transformers.__version__}, torch "
               f"{torch.__version__} (fp32, eager attention; MoE: eager experts)")
    data = {"model_file": MODEL_FILE, "model_sha256": sha, "wave": WAVE, "variants": VARIANTS,
            "made_by": made_by, "qwen2_tokenize": tokenized, "cases": out}
    if args.only:  # merge into the file as it is
        old = json.load(open(OUT))
        assert (old["model_file"], old["model_sha256"], old["wave"]) == (MODEL_FILE, sha, WAVE)
        names = [variant_name(v) for v in selected]
        variants = list(old["variants"])
        for var in selected:
            i = next((i for i, v in enumerate(variants)
                      if variant_name(v) == variant_name(var)), None)
            if i is None:
                variants.append(var)
            else:
                variants[i] = var
        new = {n: [c for c in out if c["variant"] == n] for n in names}
        merged, placed = [], set()
        for c in old["cases"]:
            v = c.get("variant", c["arch"])
            if v not in new:
                merged.append(c)
            elif v not in placed:  # the variant's new cases where its first old one stood
                merged += new[v]
                placed.add(v)
        for n in names:
            if n not in placed:
                merged += new[n]
        data = dict(old)
        data.update(variants=variants, made_by=made_by, cases=merged)
        if "qwen2" in names:
            data["qwen2_tokenize"] = tokenized
        print(f"merging {', '.join(names)} into {OUT}: " +
              ", ".join(f"{n} {'replaced' if n in placed else 'appended'}" for n in names))
    json.dump(data, open(OUT, "w"), indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
