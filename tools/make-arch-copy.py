#!/usr/bin/env python3
"""The default model's weights written as another architecture's GGUF (fp32), for benchmarks of
the architectures no model of which can be fetched here: make-golden-archs.py's variants (qwen2,
qwen3, smollm3, phi3, gemma2, gemma3, qwen3moe, mixtral) or llama itself; Gemma's window and caps
can be set, and a mixture's experts (the dense FFN cut in N parts, K used a token).

  .venv-golden/bin/python tools/make-arch-copy.py gemma3 /tmp/g/gemma3w512-f32.gguf \\
      --sliding-window 512 --softcap 0
  .venv-golden/bin/python tools/make-arch-copy.py qwen3moe /tmp/g/moe8-f32.gguf --experts 8 \\
      --experts-used 2
  build/server/quern quantize --type q4_1 --in /tmp/g/gemma3w512-f32.gguf --out ...q4_1.gguf
"""
import argparse
import os
import sys
from importlib import import_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch")
    ap.add_argument("out")
    ap.add_argument("--sliding-window", type=int)
    ap.add_argument("--softcap", type=float, help="final_logit_softcapping (0: none)")
    ap.add_argument("--attn-softcap", type=float, help="gemma2's attn_logit_softcapping")
    ap.add_argument("--experts", type=int, help="experts a mixture's FFN is cut in")
    ap.add_argument("--experts-used", type=int, help="experts a token runs")
    a = ap.parse_args()
    import gguf
    archs = import_module("make-golden-archs")
    var = {"arch": "llama"} if a.arch == "llama" else \
        dict(next(v for v in archs.VARIANTS if v.get("name", v["arch"]) == a.arch))
    if a.sliding_window is not None:
        var["sliding_window"] = a.sliding_window
    if a.softcap is not None:
        var["final_logit_softcapping"] = a.softcap
    if a.attn_softcap is not None:
        var["attn_logit_softcapping"] = a.attn_softcap
    if a.experts is not None:
        var["experts"] = a.experts
    if a.experts_used is not None:
        var["experts_used"] = a.experts_used
    reader = gguf.GGUFReader(os.path.join(archs.MODEL_DIR, archs.MODEL_FILE))
    archs.write_variant(reader, var, a.out)
    print(f"wrote {a.out}: {var}")


if __name__ == "__main__":
    main()
