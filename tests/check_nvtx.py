#!/usr/bin/env python3
"""Checks the NVTX ranges tests/nvtx_inject.c logged during a `quern bench --requests` run:
every thread's ranges nest (no pop without a push, none left open), every engine step that ran
the model holds one forward range, every forward holds one range per layer, and the ops inside a
layer are the model's (7 matmuls, attention, rope, kv_write, ...).

    check_nvtx.py LOG N_LAYERS
"""
import collections
import re
import sys


def main():
    path, n_layers = sys.argv[1], int(sys.argv[2])
    stacks = collections.defaultdict(list)
    counts = collections.Counter()
    layer_ops = collections.Counter()  # op name -> calls directly inside layer ranges
    forwards_in_steps = 0
    errors = []
    for line in open(path, errors="replace"):
        tid, _, rest = line.rstrip("\n").partition(" ")
        what, _, name = rest.partition(" ")
        st = stacks[tid]
        if what == "push":
            kind = re.sub(r"[ :].*", "", name) if not name.startswith("engine step") else "step"
            if name.startswith("graph ") or name.startswith("http: "):
                kind = name
            counts[kind] += 1
            if kind == "forward" and st and st[-1] == "step":
                forwards_in_steps += 1
            if st and st[-1] == "layer":
                layer_ops[name.split(" ")[0]] += 1
            st.append(kind)
        elif what == "pop":
            if not st:
                errors.append(f"thread {tid}: a pop without a push")
            else:
                st.pop()
        else:
            errors.append(f"bad line: {line!r}")
    for tid, st in stacks.items():
        if st:
            errors.append(f"thread {tid}: {len(st)} range(s) left open: {st}")
    if counts["forward"] == 0:
        errors.append("no forward ranges")
    if forwards_in_steps != counts["forward"]:
        errors.append(f"{counts['forward']} forwards, {forwards_in_steps} inside engine steps")
    if counts["layer"] != n_layers * counts["forward"]:
        errors.append(f"{counts['layer']} layer ranges for {counts['forward']} forwards of "
                      f"{n_layers} layers")
    per_layer = {k: v / max(counts["layer"], 1) for k, v in layer_ops.items()}
    if per_layer.get("matmul") != 7 or per_layer.get("attention") != 1:
        errors.append(f"ops per layer: {per_layer}")
    if errors:
        print("check_nvtx: FAIL\n  " + "\n  ".join(errors))
        return 1
    print(f"check_nvtx: ok ({counts['step']} engine steps, {counts['forward']} forwards, "
          f"{counts['layer']} layers, ops per layer {dict(sorted(per_layer.items()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
