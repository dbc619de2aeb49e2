#!/usr/bin/env python3
"""The built-in web page (GET /) in a real headless browser against the real daemon and model.

Debian's chromium driven by Selenium through Debian's chromium-driver (tools/setup.sh installs
all three). One daemon with an API key and --precision f32 (the default q8 does not answer
"Paris" to the question below on this model): the page asks for the key once; "What is the
capital of France?" (Enter sends) streams an answer with "Paris" in it, with tok/s and TTFT
under it; regenerate answers again; Continue writes on an answer cut by max tokens; the stop
button during a long answer aborts the request on the server (the engine's abort counter in
/metrics); the engine view during 8 concurrent
requests fired from Python shows running requests and KV blocks in use, then all free; the page
at phone width; reload keeps the conversations and the key; Markdown from the model never
becomes markup; a reasoning model's reasoning shows folded above its answer, as text; no
console errors. Then a daemon with --no-webui answers / with 404.

Screenshots go to $QUERN_BUILD_DIR (meson's build directory): webui-chat.png, webui-engine.png,
webui-phone.png. The JavaScript is syntax-checked by `node --check` when node is installed;
otherwise Chromium loading it without a console error is the check. Exit 0 when every check
passed, 1 when one failed, 77 (meson's "skipped") without the model, without the browser
packages, or in sanitizer builds (QUERN_SANITIZED: one browser run per tools/test.sh)."""
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

BIN = os.environ.get("QUERN_BIN", "")
MODEL = os.environ.get("QUERN_MODEL", "")
OUT = os.environ.get("QUERN_BUILD_DIR", ".")
SRC = os.path.dirname(os.path.abspath(__file__))
KEY = "webui-key-17"
FAILS = []


def check(cond, what, detail=""):
    print(("ok: " if cond else "FAIL: ") + what + ("" if cond or not detail else f"\n    {detail}"))
    if not cond:
        FAILS.append(what)
    return cond


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


if os.environ.get("QUERN_SANITIZED"):
    skip("the browser test runs once, in the release build")
if not BIN or not MODEL or not os.path.exists(MODEL):
    skip("needs QUERN_BIN and QUERN_MODEL")
try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    # Debian's python3-selenium lives in the system interpreter; a pyenv/venv python3 may
    # come first on PATH
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    skip("python3-selenium is not installed (tools/setup.sh installs it)")
CHROME = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
if not CHROME or not DRIVER:
    skip("chromium and chromium-driver are not installed (tools/setup.sh installs them)")


class Daemon:
    """quern serve on port 0; the port comes from its 'listening on' log line."""

    def __init__(self, *args):
        self.lines = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [BIN, "serve", "--model", MODEL, "--port", "0", "--threads", "2", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
        self.port = None
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(120) or self.port is None:
            self.stop()
            raise RuntimeError("daemon did not become ready:\n" + "\n".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "ready in" in line:
                self.ready.set()

    def get(self, path, key=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            c.request("POST", path, body=json.dumps(body),
                      headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def metric(self, name):
        _, data = self.get("/metrics")
        for line in data.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def stop(self):
        """SIGTERM; True when it exited 0 with no sanitizer report on its stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        bad = [ln for ln in self.lines if "Sanitizer" in ln or "runtime error" in ln]
        return self.proc.returncode == 0 and not bad


ABORTS = 'quern_engine_requests_finished_total{finished_reason="abort"}'


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = CHROME
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,800", "--no-first-run", "--disable-extensions",
              "--hide-scrollbars"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=o)


class Page:
    def __init__(self, d):
        self.d = d
        self.console = []

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def wait(self, cond, timeout, what):
        try:
            r = WebDriverWait(self.d, timeout, poll_frequency=0.05).until(lambda d: cond())
            check(True, what)
            return r
        except TimeoutException:
            check(False, what, "timed out")
            return None

    def collect_console(self):
        self.console += self.d.get_log("browser")

    def last_answer(self):
        return self.js("const b = document.querySelectorAll('#messages .msg.assistant .body');"
                       "return b.length ? b[b.length - 1].textContent : '';")

    def last_stats(self):
        return self.js("const s = document.querySelectorAll('#messages .msg.assistant .stats');"
                       "return s.length ? s[s.length - 1].textContent : '';")

    def set_value(self, elem_id, value):
        e = self.d.find_element(By.ID, elem_id)
        e.clear()
        e.send_keys(str(value))
        self.js("arguments[0].dispatchEvent(new Event('change'))", e)

    def stop_visible(self):
        return self.d.find_element(By.ID, "stop").is_displayed()


def test_js_syntax():
    node = shutil.which("node") or shutil.which("nodejs")
    js = os.path.join(SRC, "..", "server", "webui", "app.js")
    if node:
        r = subprocess.run([node, "--check", js], capture_output=True, text=True)
        check(r.returncode == 0, "app.js passes node --check", r.stderr)
    else:
        print("note: node not installed: Chromium loading app.js with no console error is the "
              "syntax check")


def test_key_and_question(p, dm):
    d = p.d
    d.get(dm.url + "/")
    p.wait(lambda: d.find_element(By.ID, "key-dialog").is_displayed(), 10,
           "the page asks for the API key (the daemon has one)")
    d.find_element(By.ID, "key-input").send_keys(KEY + Keys.ENTER)
    p.wait(lambda: p.js("return document.body.dataset.ready") == "1", 10, "the page is ready")
    check(not d.find_element(By.ID, "key-dialog").is_displayed(), "the key dialog closes")
    p.set_value("set-temp", 0)
    p.set_value("set-max-tokens", 32)
    box = d.find_element(By.ID, "input")
    box.send_keys("a")
    box.send_keys(Keys.SHIFT + Keys.ENTER)
    box.send_keys("b")
    check(box.get_attribute("value") == "a\nb" and not p.stop_visible(),
          "Shift+Enter writes a newline and does not send")
    box.clear()
    # every text the answer shows on its way, to see it arrive in pieces
    p.js("window.__seen = [];"
         "new MutationObserver(() => {"
         "  const b = document.querySelectorAll('#messages .msg.assistant .body');"
         "  if (b.length) window.__seen.push(b[b.length - 1].textContent);"
         "}).observe(document.getElementById('messages'), {childList: true, subtree: true});")
    box.send_keys("What is the capital of France?" + Keys.ENTER)
    p.wait(lambda: "Paris" in p.last_answer() and not p.stop_visible(), 60,
           "the answer to 'What is the capital of France?' names Paris")
    seen = [s for s in dict.fromkeys(p.js("return window.__seen")) if s]
    check(len(seen) >= 3 and all(seen[-1].startswith(s) for s in seen),
          f"the answer streamed in ({len(seen)} growing texts)", repr(seen[:6]))
    stats = p.last_stats()
    check("tok/s" in stats and "TTFT" in stats, f"tok/s and TTFT under the answer: {stats!r}")
    print(f"answer: {p.last_answer()!r}")
    d.save_screenshot(os.path.join(OUT, "webui-chat.png"))
    # regenerate: the answer is replaced, not added to
    n = p.js("return document.querySelectorAll('#messages .msg').length")
    p.js("document.querySelectorAll('#messages .msg').forEach(m => m.dataset.old = '1')")
    d.find_element(By.ID, "regen").click()
    # the answer may stream and end between two polls: look for new nodes, not the stop button
    p.wait(lambda: not p.js("return document.querySelectorAll('#messages .msg[data-old]').length")
           and not p.stop_visible() and p.last_stats(), 60, "regenerate answers again")
    check(p.js("return document.querySelectorAll('#messages .msg').length") == n
          and "Paris" in p.last_answer(), "regenerate replaces the answer (greedy: Paris again)")
    p.collect_console()


def test_model_pick(p, dm):
    """With LoRA adapters (--lora), the header offers the model and each adapter; an answer
    asked with the adapter picked runs with it (its counter in /metrics)."""
    if not dm.lora:
        check(False, "the daemon has a LoRA adapter to pick (QUERN_MAKE_LORA wrote one)")
        return
    opts = p.js("const s = document.getElementById('model-pick');"
                "return s.hidden ? null : Array.from(s.options).map(o => o.value)")
    base = p.js("return app.config.model")
    check(opts == [base, "gold"], "the header offers the model and its LoRA adapter", repr(opts))
    name = 'quern_lora_requests_finished_total{lora_name="gold"}'
    before = dm.metric(name) or 0
    p.d.find_element(By.ID, "tab-chat").click()  # the engine view may be showing
    p.js("const s = document.getElementById('model-pick'); s.value = 'gold';")
    p.set_value("set-max-tokens", 8)
    p.js("document.querySelectorAll('#messages .msg').forEach(m => m.dataset.old = '1')")
    p.d.find_element(By.ID, "input").send_keys("Hi" + Keys.ENTER)
    p.wait(lambda: p.js("return document.querySelectorAll('#messages .msg:not([data-old])')"
                        ".length") >= 2 and not p.stop_visible() and p.last_stats(), 60,
           "an answer with the adapter picked")
    after = before
    for _ in range(40):  # the engine publishes its counters after the step that answered
        after = dm.metric(name) or 0
        if after > before:
            break
        time.sleep(0.05)
    check(after == before + 1, f"it ran with the adapter ({name}: {before} -> {after})")
    p.js(f"document.getElementById('model-pick').value = {json.dumps(base)};")
    p.collect_console()


def test_continue(p, dm):
    """An answer cut by max tokens is written on by Continue (continue_final_message): the same
    message grows from where it stopped, and the button is off once the answer is whole."""
    d = p.d
    d.find_element(By.ID, "new-chat").click()
    p.set_value("set-temp", 0)
    p.set_value("set-max-tokens", 5)
    check(d.find_element(By.ID, "cont").get_attribute("disabled") is not None,
          "Continue is off in a new conversation")
    d.find_element(By.ID, "input").send_keys("Name three colors." + Keys.ENTER)
    p.wait(lambda: p.last_stats() and not p.stop_visible(), 60, "a short answer, cut at 5 tokens")
    # the message's text, not the page's (a list in Markdown renders without its numbers)
    text = "const m = app.current.messages; return m[m.length - 1].content;"
    cut = p.js(text)
    n = p.js("return document.querySelectorAll('#messages .msg').length")
    button = d.find_element(By.ID, "cont")
    check(button.get_attribute("disabled") is None, "Continue is on after an answer cut short")
    p.set_value("set-max-tokens", 60)
    button.click()
    p.wait(lambda: len(p.js(text)) > len(cut) and p.last_stats() and not p.stop_visible(),
           60, "Continue writes on")
    whole = p.js(text)
    check(whole.startswith(cut) and len(whole) > len(cut) and
          p.js("return document.querySelectorAll('#messages .msg').length") == n,
          "the same answer grows from where it stopped", f"{cut!r} -> {whole!r}")
    p.collect_console()


def test_stop(p, dm):
    d = p.d
    d.find_element(By.ID, "new-chat").click()
    p.set_value("set-temp", 0.8)
    p.set_value("set-max-tokens", 1000)
    p.set_value("set-seed", 7)
    before = dm.metric(ABORTS) or 0
    d.find_element(By.ID, "input").send_keys(
        "Write a long story about a dragon who learns to bake bread." + Keys.ENTER)
    p.wait(lambda: len(p.last_answer()) > 40, 60, "the long answer starts streaming")
    check(p.stop_visible(), "the stop button shows while streaming")
    d.find_element(By.ID, "stop").click()
    t0 = time.time()
    after = before
    while time.time() - t0 < 10 and after <= before:
        time.sleep(0.05)
        after = dm.metric(ABORTS) or 0
    check(after == before + 1, f"stop aborts the request on the server ({ABORTS} "
          f"{before:.0f} -> {after:.0f}, {time.time() - t0:.2f} s after the click)")
    p.wait(lambda: not p.stop_visible(), 5, "the page leaves the streaming state")
    check("stopped" in p.last_stats(), f"the answer says it was stopped: {p.last_stats()!r}")
    _, body = dm.get("/v1/engine/state", KEY)
    check(json.loads(body)["running"] == 0, "nothing runs after the stop")
    p.collect_console()


def test_engine_view(p, dm):
    d = p.d
    d.find_element(By.ID, "tab-engine").click()
    p.wait(lambda: d.find_element(By.ID, "eng-running").text == "0", 10,
           "the engine view shows an idle engine")
    results = []

    def one(i):
        results.append(dm.post("/v1/completions", {
            "prompt": f"Request {i}: tell me about the number {i * 7}.", "max_tokens": 96,
            "temperature": 0.8, "seed": i, "ignore_eos": True})[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    best = {"running": 0, "rows": 0, "used": 0, "decode": 0}
    shot = False
    t0 = time.time()
    while time.time() - t0 < 60 and any(t.is_alive() for t in threads):
        v = p.js("return {running: +document.getElementById('eng-running').textContent || 0,"
                 " rows: document.querySelectorAll('#req-body tr.req-row').length,"
                 " decode: document.querySelectorAll('#req-body tr[data-state=decode]').length,"
                 " used: +(document.getElementById('kv-grid').dataset.used || 0)}")
        for k in best:
            best[k] = max(best[k], v[k])
        if not shot and v["decode"] >= 8:
            time.sleep(0.6)  # a few polls: the step and throughput charts fill
            d.save_screenshot(os.path.join(OUT, "webui-engine.png"))
            shot = True
        time.sleep(0.1)
    for t in threads:
        t.join()
    check(results == [200] * 8, f"the 8 concurrent requests succeed: {results}")
    check(best["running"] >= 8 and best["rows"] >= 8 and best["decode"] >= 8,
          f"the engine view showed them running (at most {best['running']} running, "
          f"{best['rows']} rows, {best['decode']} decoding at once)")
    check(best["used"] >= 8, f"the KV grid showed blocks in use (at most {best['used']})")
    check(shot, "a screenshot of the busy engine view was taken")
    p.wait(lambda: d.find_element(By.ID, "eng-running").text == "0"
           and p.js("return document.getElementById('kv-grid').dataset.used") == "0"
           and not p.js("return document.querySelectorAll('#req-body tr.req-row').length"),
           10, "then every request is gone and every KV block is free")
    st = json.loads(dm.get("/v1/engine/state", KEY)[1])
    check(st["kv"]["used"] == 0 and st["kv"]["cells"].count("1") == st["kv"]["cached_free"] > 0,
          f"the pool: 0 in use, {st['kv']['cached_free']} free blocks holding cached prefixes")
    cost = st["cost"]
    print(f"engine picture cost: {cost['step_ns_avg'] / 1000:.1f} us a step on average over "
          f"{cost['steps']} steps, max {cost['step_ns_max'] / 1000:.1f} us (a publication "
          f"at most {cost['publish_ns_max'] / 1000:.1f} us); the last steps took "
          f"{sum(s['ms'] for s in st['steps']) / max(1, len(st['steps'])):.1f} ms on average")
    check(sum(st["history"]["generated"]) >= 8 * 96, "the throughput history counts the tokens")
    p.collect_console()


def test_markdown_is_safe(p):
    r = p.js("const d = document.createElement('div');"
             "renderMarkdown(d, '<img src=x onerror=\"window.__pwned=1\"> **bold** `x<y`\\n"
             "- item <b>one</b>\\n\\n```js\\nif (a < b) alert(1)\\n```\\n# Title');"
             "document.body.appendChild(d);"
             "const out = {img: d.querySelectorAll('img, b').length,"
             " strong: (d.querySelector('strong') || {}).textContent,"
             " li: (d.querySelector('li') || {}).textContent,"
             " code: (d.querySelector('pre code') || {}).textContent,"
             " h: (d.querySelector('h3') || {}).textContent};"
             "d.remove(); return out;")
    check(r["img"] == 0 and r["strong"] == "bold" and r["li"] == "item <b>one</b>"
          and r["code"] == "if (a < b) alert(1)" and r["h"] == "Title",
          "Markdown renders as nodes with text, never as markup", repr(r))


def test_reasoning_block(p):
    """A reasoning model's delta.reasoning_content shows in a folded block above the answer, as
    text; open while it streams and nothing of the answer has come."""
    r = p.js("const a = {role: 'assistant', content: 'Four.', reasoning: 'Let <b>me</b> see', stats: null};"
             "const n = messageNode(a, false);"
             "const s = messageNode({role: 'assistant', content: '', reasoning: 'hm', stats: null}, true);"
             "const t = n.querySelector('details.reasoning .reasoning-text');"
             "return {text: t && t.textContent, tags: n.querySelectorAll('details b').length,"
             " open: n.querySelector('details').open,"
             " streaming_open: s.querySelector('details').open,"
             " body: n.querySelector('.body').textContent,"
             " plain: messageNode({role: 'assistant', content: 'x', stats: null}, false)"
             ".querySelectorAll('details').length};")
    check(r["text"] == "Let <b>me</b> see" and r["tags"] == 0 and not r["open"]
          and r["streaming_open"] and r["body"].strip() == "Four." and r["plain"] == 0,
          "reasoning shows folded above the answer, as text (open while only it streams)", repr(r))


def test_reload_and_phone(p, dm):
    d = p.d
    d.get(dm.url + "/")
    p.wait(lambda: p.js("return document.body.dataset.ready") == "1", 10, "the reloaded page is ready")
    check(not d.find_element(By.ID, "key-dialog").is_displayed(),
          "the key is not asked again in the same tab")
    titles = p.js("return [...document.querySelectorAll('#conv-list .conv-title')]"
                  ".map(b => b.textContent)")
    check(len(titles) >= 2 and any("capital of France" in t for t in titles),
          f"the conversations survive a reload: {titles}")
    d.set_window_size(390, 844)
    time.sleep(0.3)
    w = p.js("return [document.documentElement.scrollWidth, window.innerWidth,"
             " document.getElementById('sidebar').getBoundingClientRect().right]")
    check(w[0] <= w[1] and w[2] <= 0 and d.find_element(By.ID, "menu-toggle").is_displayed(),
          f"phone width: no sideways scroll, the sidebar is a drawer behind the menu button ({w})")
    d.find_element(By.ID, "menu-toggle").click()
    p.wait(lambda: p.js("return document.getElementById('sidebar').getBoundingClientRect().left")
           >= 0, 5, "phone width: the menu button opens the drawer")
    d.find_elements(By.CSS_SELECTOR, "#conv-list .conv-title")[-1].click()
    time.sleep(0.3)
    w = p.js("return [document.documentElement.scrollWidth, window.innerWidth,"
             " document.getElementById('sidebar').getBoundingClientRect().right]")
    check(w[0] <= w[1] and w[2] <= 0, f"phone width: picking a conversation closes the drawer ({w})")
    check("Paris" in p.last_answer(), "phone width: the conversation shows")
    d.save_screenshot(os.path.join(OUT, "webui-phone.png"))
    d.set_window_size(1280, 800)
    p.collect_console()


def test_no_webui():
    dm = Daemon("--no-webui")
    try:
        check(dm.get("/")[0] == 404 and dm.get("/webui/app.js")[0] == 404,
              "--no-webui: / and /webui/app.js are 404")
        check(dm.get("/v1/engine/state")[0] == 200, "--no-webui: /v1/engine/state still answers")
    finally:
        check(dm.stop(), "--no-webui: the daemon exits 0", "\n    ".join(dm.lines[-20:]))


def main():
    t_start = time.time()
    test_js_syntax()
    # a LoRA adapter to pick in the header (test_model_pick)
    lora_args, lora_path = [], None
    if os.environ.get("QUERN_MAKE_LORA"):
        lora_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"quern-webui-{os.getpid()}.gguf")
        if subprocess.run([os.environ["QUERN_MAKE_LORA"], MODEL, lora_path]).returncode == 0:
            lora_args = ["--lora", "gold=" + lora_path]
    dm = Daemon("--api-key", KEY, "--precision", "f32", *lora_args)
    dm.lora = bool(lora_args)
    d = None
    try:
        d = browser()
        p = Page(d)
        # the console is read back: a probe error must show up, or the check below means nothing
        d.get(dm.url + "/webui/config.json")
        d.execute_script("console.error('quern-console-probe')")
        probe = d.get_log("browser")
        check(any("quern-console-probe" in e.get("message", "") for e in probe),
              "the browser's console log is read back (a probe error shows)", repr(probe))
        test_key_and_question(p, dm)
        test_continue(p, dm)
        test_stop(p, dm)
        test_engine_view(p, dm)
        test_markdown_is_safe(p)
        test_reasoning_block(p)
        test_model_pick(p, dm)
        test_reload_and_phone(p, dm)
        errors = [e for e in p.console if e.get("level") == "SEVERE"]
        check(not errors, f"no console errors ({len(p.console)} console entries in all)",
              "\n    ".join(e.get("message", "") for e in errors[:10]))
    finally:
        if d is not None:
            d.quit()
        check(dm.stop(), "the daemon exits 0 on SIGTERM, with no sanitizer report",
              "\n    ".join(dm.lines[-20:]))
    if lora_path and os.path.exists(lora_path):
        os.unlink(lora_path)
    test_no_webui()
    print(f"test_webui: {time.time() - t_start:.1f} s; screenshots in {OUT}")
    if FAILS:
        print(f"{len(FAILS)} FAILED: " + "; ".join(FAILS))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
