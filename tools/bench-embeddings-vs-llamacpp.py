#!/usr/bin/env python3
"""Embeddings throughput of quern serve next to llama.cpp's llama-server --embeddings, same model,
same machine, same run (issue 15), and how far apart their vectors are.

    tools/bench-embeddings-vs-llamacpp.py [--model M] [--threads 2] [--n 64] [--len 128]
        [--reps 3] [--precision f32|q8]

Both servers get the same POST /v1/embeddings body: n inputs of len random token ids (seeded,
above the special tokens), mean pooling, L2-normalized (llama-server's /v1/embeddings
normalizes). They run one at a time (the other idles), each after one warm-up request; the
figure is n / the median wall time of reps requests. The agreement line is the cosine between
the two servers' vectors for each input (quern with f32 activations against llama.cpp's int8
ones: close to 1, not equal). llama-server comes from tools/build-llamacpp.sh
(LLAMA_TARGETS=llama-server is enough)."""
import argparse
import http.client
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def request(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_healthy(port, proc, what, timeout=300):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            if request(port, "GET", "/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"{what} did not become healthy")


def embed(port, body):
    t0 = time.time()
    st, data = request(port, "POST", "/v1/embeddings", body)
    dt = time.time() - t0
    if st != 200:
        sys.exit(f"port {port}: {st} {data[:300]!r}")
    return dt, [x["embedding"] for x in sorted(json.loads(data)["data"], key=lambda x: x["index"])]


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) *
                                                         sum(y * y for y in b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--quern", default=os.path.join(ROOT, "build/server/quern"))
    ap.add_argument("--llama",
                    default=os.path.join(ROOT, "third_party/llama.cpp/build/bin/llama-server"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--precision", default="f32")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ids = [[rng.randrange(100, 49152) for _ in range(a.len)] for _ in range(a.n)]
    body = {"input": ids}
    qp, lp = free_port(), free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [a.quern, "serve", "--model", a.model, "--port", str(qp), "--threads", str(a.threads),
             "--precision", a.precision], stderr=subprocess.DEVNULL))
        wait_healthy(qp, procs[-1], "quern")
        # one slot per input, each with room for its tokens
        procs.append(subprocess.Popen(
            [a.llama, "-m", a.model, "--embeddings", "--pooling", "mean", "--port", str(lp),
             "-t", str(a.threads), "-np", str(a.n), "-c", str(a.n * (a.len + 16)),
             "-b", "2048", "-ub", "2048"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy(lp, procs[-1], "llama-server")
        res = {}
        for name, port in (("quern", qp), ("llama.cpp", lp)):
            embed(port, body)  # warm-up
            times, vecs = [], None
            for _ in range(a.reps):
                dt, vecs = embed(port, body)
                times.append(dt)
            res[name] = (statistics.median(times), vecs)
        agree = [cos(x, y) for x, y in zip(res["quern"][1], res["llama.cpp"][1])]
        out = {"inputs": a.n, "input_len": a.len, "threads": a.threads, "precision": a.precision,
               "reps": a.reps, "dim": len(res["quern"][1][0]),
               "quern_embeddings_per_s": round(a.n / res["quern"][0], 2),
               "llamacpp_embeddings_per_s": round(a.n / res["llama.cpp"][0], 2),
               "cosine_min": round(min(agree), 5), "cosine_mean": round(statistics.mean(agree), 5)}
        print(json.dumps(out))
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
