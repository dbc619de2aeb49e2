#!/usr/bin/env python3
"""Reference data for rope scaling: tests/golden/smollm2-rope.json.

The default model run by Hugging Face transformers (fp32, from the same GGUF file) with three
rope scalings it implements itself:

  * "llama3": Llama 3.1's frequency-dependent scaling (transformers' rope_type "llama3"). A
    GGUF file carries it as per-pair divisors in the tensor rope_freqs.weight, which llama.cpp's
    converter computes from the same config; this script computes them the converter's way and
    records them, so the C test writes them into a copy of the model as such a file would hold
    them. The parameters are far shorter than Llama 3's (an original context of 64 tokens)
    so that the scaling moves the logits at the test's short positions.
  * "linear": rope.scaling.type "linear", rope.scaling.factor 4 (transformers' rope_type
    "linear").
  * "yarn": rope.scaling.type "yarn", factor 4, rope.scaling.original_context_length 64
    (transformers' rope_type "yarn": its own blend of the frequencies and attention factor).

For each, the greedy continuation of two golden prompts (token ids taken from
tests/golden/smollm2.json), the top-2 gap at every step and the top-5 logits at four
positions, as tools/make-golden.py records them; and how far the unscaled model's logits are
from them (the test must be able to tell the two apart).

Run with the venv tools/make-golden.sh sets up:  .venv-golden/bin/python tools/make-golden-rope.py
"""
import json
import math
import os

import numpy as np

from golden_record import golden_cases, greedy_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = os.path.join(ROOT, "tests", "golden", "smollm2.json")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2-rope.json")
N_NEW = 32
TOPK = 5
PROMPTS = ["chat-capital", "chat-code"]

SCALINGS = [
    ("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("linear", {"rope_type": "linear", "factor": 4.0}),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
]


def converter_factors(sc, base, dim):
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py derives it from a llama3 config:
    1 for short wavelengths, the factor for long ones, a smooth blend between."""
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old = sc["original_max_position_embeddings"]
    lo, hi, factor = sc["low_freq_factor"], sc["high_freq_factor"], sc["factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return [float(np.float32(x)) for x in out]


def main():
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cases, sha = golden_cases(GOLDEN, os.path.join(MODEL_DIR, MODEL_FILE))

    def load(rope_scaling):
        cfg = AutoConfig.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE)
        if rope_scaling is not None:
            theta = getattr(cfg, "rope_theta", None)
            if theta is None:
                theta = cfg.rope_parameters["rope_theta"]
            if hasattr(cfg, "rope_parameters"):  # transformers >= 5
                cfg.rope_parameters = dict(rope_scaling, rope_theta=theta)
            else:
                cfg.rope_scaling = dict(rope_scaling)
        m = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE, config=cfg,
                                                 dtype=torch.float32)
        m.eval()
        return m, cfg

    def full_logits(m, ids):
        with torch.no_grad():
            return m(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()

    plain, cfg0 = load(None)
    base = getattr(cfg0, "rope_theta", None) or cfg0.rope_parameters["rope_theta"]
    head_dim = cfg0.hidden_size // cfg0.num_attention_heads
    out_cases = []
    for sname, sc in SCALINGS:
        m, _ = load(sc)
        rope = {"type": sc["rope_type"], "transformers_rope_scaling": sc}
        if sname == "llama3":
            rope["freqs"] = converter_factors(sc, base, head_dim)
        else:
            rope["factor"] = sc["factor"]
        if sname == "yarn":
            rope["original_context_length"] = sc["original_max_position_embeddings"]
        # transformers itself must scale: its inverse frequencies differ from the plain model's
        inv = m.model.rotary_emb.inv_freq.numpy()
        inv0 = plain.model.rotary_emb.inv_freq.numpy()
        assert not np.allclose(inv, inv0), f"{sname}: transformers did not apply the scaling"
        if sname == "llama3":
            ratio = inv0 / inv
            assert np.allclose(ratio, rope["freqs"], rtol=1e-5), (ratio, rope["freqs"])
        for pname in PROMPTS:
            prompt = cases[pname]["prompt_ids"]
            greedy, gaps, entries, worst_plain = greedy_record(
                lambda ids: full_logits(m, ids), prompt, N_NEW, (0, 10, 20), TOPK,
                other=lambda ids: full_logits(plain, ids))
            out_cases.append({"name": f"{sname}-{pname}", "rope": rope, "prompt_ids": prompt,
                              "greedy_ids": greedy, "top2_gap": gaps, "logits": entries,
                              "unscaled_worst_rel_diff": worst_plain,
                              "greedy_same_as_unscaled": greedy == cases[pname]["greedy_ids"][:N_NEW]})
            print(f"{sname}-{pname}: unscaled model's worst relative top-5 logit difference "
                  f"{worst_plain:.3f}; greedy text {'same as' if out_cases[-1]['greedy_same_as_unscaled'] else 'differs from'} unscaled")
    json.dump({"model_file": MODEL_FILE, "model_sha256": sha,
               "made_by": f"tools/make-golden-rope.py, transformers {transformers.__version__}, "
                          f"torch {torch.__version__}",
               "cases": out_cases}, open(OUT, "w"), indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
