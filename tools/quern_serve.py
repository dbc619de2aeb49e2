"""A quern daemon for the benchmark scripts: started on a port, ready when /health answers."""
import os
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "server", "quern")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def start(binary, model, port, threads, *args):
    """`quern serve` with the web page off and args after; returns its Popen once /health
    answers (or after 60 s: the first request then says what went wrong)."""
    srv = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port), "--threads",
                            str(threads), "--no-webui", *args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return srv


def cpu_line():
    """tools/cpu-info.sh's line: the CPU and its SIMD flags, for the tables."""
    return subprocess.run([os.path.join(ROOT, "tools", "cpu-info.sh")], capture_output=True,
                          text=True).stdout.strip()
