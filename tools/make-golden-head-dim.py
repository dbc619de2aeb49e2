#!/usr/bin/env python3
"""Reference data for a head size other than embedding_length / head_count:
tests/golden/smollm2-head-dim.json.

Files such as Mistral Nemo's say so with attention.key_length (5120 wide, 32 heads of 128). No
such model is small enough for the tests, so this one is made from the default model's own
weights: six of its nine query heads (two of the three that share each KV head, so the GQA
groups keep their K and V), head size 64, so q has 384 rows and the output projection 384
columns against a width of 576. Hugging Face transformers runs it (fp32, the GGUF's weights,
LlamaConfig with num_attention_heads 6 and head_dim 64); the C test writes the same cut into a
copy of the GGUF with head_count 6 and key_length/value_length 64, and compares.

Recorded per prompt (token ids from tests/golden/smollm2.json): the greedy continuation, the
top-2 gap at each step and the top-5 logits at four positions, as tools/make-golden-rope.py
records them.

Run with the venv tools/make-golden.sh sets up:  .venv-golden/bin/python tools/make-golden-head-dim.py
"""
import json
import os

import numpy as np

from golden_record import golden_cases, greedy_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = os.path.join(ROOT, "tests", "golden", "smollm2.json")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2-head-dim.json")
N_NEW = 24
TOPK = 5
PROMPTS = ["chat-capital", "chat-code"]
KEEP_HEADS = [0, 1, 3, 4, 6, 7]  # of 9; heads 3g..3g+2 share KV head g
HEAD_DIM = 64


def main():
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cases, sha = golden_cases(GOLDEN, os.path.join(MODEL_DIR, MODEL_FILE))

    full = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE,
                                                dtype=torch.float32)
    cfg = AutoConfig.from_pretrained(MODEL_DIR, gguf_file=MODEL_FILE)
    assert cfg.num_attention_heads == 9 and cfg.num_key_value_heads == 3
    assert cfg.hidden_size // cfg.num_attention_heads == HEAD_DIM
    cfg.num_attention_heads = len(KEEP_HEADS)
    cfg.head_dim = HEAD_DIM
    cut = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    rows = np.concatenate([np.arange(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in KEEP_HEADS])
    state = full.state_dict()
    for name, t in state.items():
        if name.endswith("self_attn.q_proj.weight"):
            state[name] = t[rows, :].clone()
        elif name.endswith("self_attn.o_proj.weight"):
            state[name] = t[:, rows].clone()
    missing, unexpected = cut.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    if cfg.tie_word_embeddings:
        cut.tie_weights()
    cut.eval()
    q0 = cut.model.layers[0].self_attn.q_proj.weight
    assert tuple(q0.shape) == (len(KEEP_HEADS) * HEAD_DIM, cfg.hidden_size), q0.shape

    def full_logits(m, ids):
        with torch.no_grad():
            return m(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()

    out_cases = []
    for pname in PROMPTS:
        prompt = cases[pname]["prompt_ids"]
        greedy, gaps, entries, worst_full = greedy_record(
            lambda ids: full_logits(cut, ids), prompt, N_NEW, (0, 8, 16), TOPK,
            other=lambda ids: full_logits(full, ids))
        out_cases.append({"name": f"heads6-{pname}", "prompt_ids": prompt, "greedy_ids": greedy,
                          "top2_gap": gaps, "logits": entries, "full_model_worst_rel_diff": worst_full})
        print(f"heads6-{pname}: the nine-head model's worst relative top-5 logit difference "
              f"{worst_full:.3f}; greedy {greedy[:8]}...")
    json.dump({"model_file": MODEL_FILE, "model_sha256": sha, "keep_heads": KEEP_HEADS,
               "head_dim": HEAD_DIM,
               "made_by": f"tools/make-golden-head-dim.py, transformers {transformers.__version__}, "
                          f"torch {torch.__version__}",
               "cases": out_cases}, open(OUT, "w"), indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
