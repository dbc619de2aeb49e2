"""What the golden scripts record of one prompt (tools/make-golden-rope.py,
tools/make-golden-head-dim.py): the greedy continuation, the top-2 gap at each step, the top-k
logits at chosen positions, and how far another model's logits are from those."""
import numpy as np


def greedy_record(logits_of, prompt, n_new, offsets, topk, other=None):
    """logits_of(ids) -> [len(ids)][vocab] logits. offsets: positions after the prompt's last
    token at which to record the top-k (the last step's position is added). other: a second
    logits_of, whose worst relative difference on those top-k logits is returned (else 0)."""
    seq = list(prompt)
    for _ in range(n_new):
        seq.append(int(np.argmax(logits_of(seq)[-1])))
    L = logits_of(seq)
    L_other = other(seq) if other else None
    gaps = []
    for i in range(n_new):
        row = L[len(prompt) - 1 + i]
        top2 = np.argsort(-row, kind="stable")[:2]
        gaps.append(float(row[top2[0]] - row[top2[1]]))
    entries = []
    worst = 0.0
    for pos in [len(prompt) - 1 + o for o in offsets] + [len(seq) - 2]:
        row = L[pos]
        top = [int(t) for t in np.argsort(-row, kind="stable")[:topk]]
        entries.append({"pos": pos, "top_ids": top, "top_logits": [float(row[t]) for t in top]})
        if L_other is not None:
            for t in top:
                worst = max(worst, abs(float(L_other[pos][t]) - float(row[t])) /
                            max(abs(float(row[t])), 1.0))
    return seq[len(prompt):], gaps, entries, worst


def golden_cases(golden_path, model_path):
    """tests/golden/smollm2.json's generate cases by name, and the model file's sha256, which
    must be the one that file was made from."""
    import hashlib
    import json
    import sys

    golden = json.load(open(golden_path))
    with open(model_path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    if sha != golden["model_sha256"]:
        sys.exit(f"model sha256 {sha} is not the golden file's {golden['model_sha256']}")
    return {c["name"]: c for c in golden["generate"]}, sha
