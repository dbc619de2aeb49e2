// quern's built-in page: a chat playground over /v1/chat/completions and a live view of the
// engine from /v1/engine/state. Plain JavaScript, no build step, nothing from the network but
// this server. Model output is never parsed as HTML: every node is built with createElement and
// its text set through textContent (the server's Content-Security-Policy forbids inline script
// as a second line of defence).
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'quern.key'; // sessionStorage: this tab only
const CHATS_STORE = 'quern.chats'; // localStorage: conversations
const SETTINGS_STORE = 'quern.settings';

const app = {
  config: { auth: false, model: '' },
  chats: [],
  current: null,
  busy: false,
  controller: null,
  enginePoll: null,
  pollGen: 0, // one polling loop at a time: a loop whose generation is stale ends
  keyWaiters: [],
};

// ---- storage ----

function loadJSON(storage, name, fallback) {
  try {
    const v = JSON.parse(storage.getItem(name));
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}

function saveChats() {
  try {
    localStorage.setItem(CHATS_STORE, JSON.stringify(app.chats));
  } catch (e) {
    // storage full or disabled: the conversation still lives in this page
  }
}

function saveSettings() {
  const s = readSettings();
  localStorage.setItem(SETTINGS_STORE, JSON.stringify(s));
}

function readSettings() {
  return {
    system: $('set-system').value,
    temperature: $('set-temp').value,
    top_p: $('set-top-p').value,
    max_tokens: $('set-max-tokens').value,
    seed: $('set-seed').value,
  };
}

function restoreSettings() {
  const s = loadJSON(localStorage, SETTINGS_STORE, null);
  if (!s) return;
  $('set-system').value = s.system || '';
  if (s.temperature !== undefined) $('set-temp').value = s.temperature;
  if (s.top_p !== undefined) $('set-top-p').value = s.top_p;
  if (s.max_tokens !== undefined) $('set-max-tokens').value = s.max_tokens;
  $('set-seed').value = s.seed || '';
}

// ---- the API key: asked once, kept in sessionStorage ----

function apiKey() {
  return sessionStorage.getItem(KEY_STORE) || '';
}

function askKey(why) {
  $('key-why').textContent = why;
  $('key-dialog').hidden = false;
  $('key-input').value = '';
  $('key-input').focus();
  return new Promise((resolve) => app.keyWaiters.push(resolve));
}

function onKeySubmit(ev) {
  ev.preventDefault();
  const key = $('key-input').value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORE, key);
  $('key-dialog').hidden = true;
  const waiters = app.keyWaiters;
  app.keyWaiters = [];
  waiters.forEach((w) => w(key));
}

async function ensureKey() {
  if (app.config.auth && !apiKey())
    await askKey('This server needs an API key. It is kept for this tab only (session storage).');
}

// fetch with the key; a 401 asks for a new key once and retries
async function apiFetch(path, opts = {}) {
  await ensureKey();
  for (let attempt = 0; ; attempt++) {
    const headers = Object.assign({}, opts.headers || {});
    const key = apiKey();
    if (key) headers.Authorization = 'Bearer ' + key;
    const r = await fetch(path, Object.assign({}, opts, { headers }));
    if (r.status !== 401 || attempt > 0) return r;
    sessionStorage.removeItem(KEY_STORE);
    await askKey('The server refused that key. Enter the API key again.');
  }
}

// ---- safe Markdown: a small subset, rendered into DOM nodes ----

function el(tag, cls, text) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (text !== undefined) n.textContent = text;
  return n;
}

// inline: `code`, **bold**, *italic* / _italic_; everything else is text
function renderInline(parent, text) {
  const re = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\s][^*\n]*\*|_[^_\s][^_\n]*_)/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    const t = m[0];
    if (t[0] === '`') parent.appendChild(el('code', '', t.slice(1, -1)));
    else if (t.startsWith('**')) parent.appendChild(el('strong', '', t.slice(2, -2)));
    else parent.appendChild(el('em', '', t.slice(1, -1)));
    last = m.index + t.length;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function renderMarkdown(container, text) {
  container.replaceChildren();
  const lines = text.split('\n');
  let para = [];
  let list = null;
  const flushPara = () => {
    if (para.length) {
      const p = el('p');
      renderInline(p, para.join('\n'));
      container.appendChild(p);
      para = [];
    }
  };
  const endList = () => {
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
    if (fence) {
      flushPara();
      endList();
      const code = [];
      i++;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) code.push(lines[i++]);
      const pre = el('pre');
      if (fence[1]) pre.appendChild(el('span', 'lang', fence[1]));
      pre.appendChild(el('code', '', code.join('\n')));
      container.appendChild(pre);
      continue;
    }
    const h = line.match(/^(#{1,6})\s+(.*)$/);
    const ul = line.match(/^\s*[-*+]\s+(.*)$/);
    const ol = line.match(/^\s*\d+[.)]\s+(.*)$/);
    if (h) {
      flushPara();
      endList();
      const node = el(h[1].length <= 2 ? 'h3' : 'h4');
      renderInline(node, h[2]);
      container.appendChild(node);
    } else if (ul || ol) {
      flushPara();
      const tag = ul ? 'ul' : 'ol';
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = el(tag);
        container.appendChild(list);
      }
      const li = el('li');
      renderInline(li, (ul || ol)[1]);
      list.appendChild(li);
    } else if (line.trim() === '') {
      flushPara();
      endList();
    } else {
      endList();
      para.push(line);
    }
  }
  flushPara();
}

// ---- conversations ----

function newChat() {
  if (app.busy) return;
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: '', messages: [] };
  app.chats.unshift(c);
  app.current = c;
  saveChats();
  renderConvList();
  renderMessages();
  closeDrawer();
}

function selectChat(id) {
  if (app.busy) return;
  app.current = app.chats.find((c) => c.id === id) || app.current;
  renderConvList();
  renderMessages();
  closeDrawer();
}

function deleteChat(id) {
  if (app.busy) return;
  app.chats = app.chats.filter((c) => c.id !== id);
  if (!app.chats.length) {
    newChat();
    return;
  }
  if (app.current.id === id) app.current = app.chats[0];
  saveChats();
  renderConvList();
  renderMessages();
}

function renderConvList() {
  const ul = $('conv-list');
  ul.replaceChildren();
  for (const c of app.chats) {
    const li = el('li', c === app.current ? 'current' : '');
    const b = el('button', 'conv-title', c.title || 'New chat');
    b.type = 'button';
    b.title = c.title || 'New chat';
    b.addEventListener('click', () => selectChat(c.id));
    const d = el('button', 'conv-del', '\u00d7');
    d.type = 'button';
    d.setAttribute('aria-label', 'Delete conversation');
    d.addEventListener('click', () => deleteChat(c.id));
    li.append(b, d);
    ul.appendChild(li);
  }
}

function statsText(m) {
  const s = m.stats;
  if (!s) return '';
  const parts = [];
  if (s.tps !== null && s.tps !== undefined) parts.push(s.tps.toFixed(1) + ' tok/s');
  if (s.ttft_ms !== null && s.ttft_ms !== undefined) parts.push('TTFT ' + Math.round(s.ttft_ms) + ' ms');
  if (s.tokens !== undefined) parts.push(s.tokens + ' tokens');
  if (s.finish) parts.push(s.finish);
  return parts.join(' \u00b7 ');
}

function messageNode(m, streaming) {
  const wrap = el('div', 'msg ' + m.role);
  wrap.appendChild(el('div', 'role', m.role === 'user' ? 'You' : 'Assistant'));
  if (m.reasoning) {
    // a reasoning model's thinking (delta.reasoning_content): folded once the answer starts
    const think = el('details', 'reasoning');
    think.open = streaming && !m.content;
    think.appendChild(el('summary', null, 'Reasoning'));
    think.appendChild(el('div', 'reasoning-text', m.reasoning));
    wrap.appendChild(think);
  }
  const body = el('div', 'body' + (streaming ? ' cursor' : ''));
  renderMarkdown(body, m.content);
  wrap.appendChild(body);
  if (m.role === 'assistant') {
    if (m.error) wrap.appendChild(el('div', 'stats error', m.error));
    wrap.appendChild(el('div', 'stats', statsText(m)));
  }
  return wrap;
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  for (const m of app.current.messages) box.appendChild(messageNode(m, false));
  box.scrollTop = box.scrollHeight;
  $('regen').disabled = app.busy || !app.current.messages.some((m) => m.role === 'user');
  $('cont').disabled = app.busy || !canContinue();
}

// the last answer was cut (max tokens, or the stop button): it can be written on
function canContinue() {
  const msgs = app.current.messages;
  const last = msgs[msgs.length - 1];
  return !!(last && last.role === 'assistant' && last.content && !last.error && last.stats &&
    (last.stats.finish === 'length' || last.stats.finish === 'stopped'));
}

function updateLast(m, streaming) {
  const box = $('messages');
  const node = messageNode(m, streaming);
  if (box.lastChild) box.replaceChild(node, box.lastChild);
  else box.appendChild(node);
  box.scrollTop = box.scrollHeight;
}

function setBusy(b) {
  app.busy = b;
  $('send').hidden = b;
  $('stop').hidden = !b;
  $('regen').disabled = b;
  $('cont').disabled = b || !canContinue();
}

// ---- chat ----

function requestBody(messages) {
  const s = readSettings();
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  const num = (v) => (v === '' || v === undefined ? null : Number(v));
  if (num(s.temperature) !== null) body.temperature = num(s.temperature);
  if (num(s.top_p) !== null) body.top_p = num(s.top_p);
  if (num(s.max_tokens) !== null) body.max_tokens = Math.max(1, Math.floor(num(s.max_tokens)));
  if (num(s.seed) !== null) body.seed = Math.floor(num(s.seed));
  const pick = $('model-pick');
  if (!pick.hidden && pick.value && pick.value !== app.config.model) body.model = pick.value;
  return body;
}

// the model and its LoRA adapters (GET /v1/models), offered when there is more than one
async function loadModels() {
  let data = [];
  try {
    const r = await apiFetch('/v1/models');
    if (r.ok) data = (await r.json()).data || [];
  } catch (e) {
    return; // the daemon is going away: the model's name stays
  }
  const pick = $('model-pick');
  const keep = pick.value;
  pick.textContent = '';
  for (const m of data) {
    const o = el('option', null, m.parent ? m.id + ' (LoRA)' : m.id);
    o.value = m.id;
    pick.appendChild(o);
  }
  if (data.some((m) => m.id === keep)) pick.value = keep;
  pick.hidden = data.length < 2;
  $('model-name').hidden = !pick.hidden;
}

// cont: the last answer is written on (continue_final_message) instead of a new one
async function generate(cont) {
  const chat = app.current;
  const s = readSettings();
  const messages = [];
  if (s.system.trim()) messages.push({ role: 'system', content: s.system });
  for (const m of chat.messages) messages.push({ role: m.role, content: m.content });
  let answer;
  if (cont) {
    answer = chat.messages[chat.messages.length - 1];
    answer.stats = null;
    updateLast(answer, true);
  } else {
    answer = { role: 'assistant', content: '', stats: null };
    chat.messages.push(answer);
    $('messages').appendChild(messageNode(answer, true));
  }
  setBusy(true);
  app.controller = new AbortController();
  const t0 = performance.now();
  let tFirst = null;
  let chunks = 0;
  let usage = null;
  let finish = null;
  try {
    const r = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(
        Object.assign(requestBody(messages), cont ? { continue_final_message: true } : {}),
      ),
      signal: app.controller.signal,
    });
    if (!r.ok) {
      let msg = 'HTTP ' + r.status;
      try {
        const j = await r.json();
        if (j.error && j.error.message) msg += ': ' + j.error.message;
      } catch (e) {
        // not JSON: the status alone
      }
      throw new Error(msg);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let done = false;
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') {
            done = true;
            break;
          }
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || 'the server failed the request');
          if (j.usage) usage = j.usage;
          const ch = j.choices && j.choices[0];
          if (!ch) continue;
          if (ch.finish_reason) finish = ch.finish_reason;
          const think = ch.delta && ch.delta.reasoning_content;
          if (think) {
            if (tFirst === null) tFirst = performance.now();
            chunks++;
            answer.reasoning = (answer.reasoning || '') + think;
            updateLast(answer, true);
          }
          const piece = ch.delta && ch.delta.content;
          if (piece) {
            if (tFirst === null) tFirst = performance.now();
            chunks++;
            answer.content += piece;
            updateLast(answer, true);
          }
        }
      }
    }
  } catch (e) {
    if (e.name === 'AbortError') finish = 'stopped';
    else answer.error = String(e.message || e);
  }
  const tEnd = performance.now();
  const tokens = usage ? usage.completion_tokens : chunks;
  // tokens after the first over the time after it: the decode rate
  const tps = tFirst !== null && tokens > 1 && tEnd > tFirst ? ((tokens - 1) * 1000) / (tEnd - tFirst) : null;
  answer.stats = { ttft_ms: tFirst !== null ? tFirst - t0 : null, tps, tokens, finish };
  app.controller = null;
  setBusy(false);
  if (!chat.title) {
    const first = chat.messages.find((m) => m.role === 'user');
    chat.title = first ? first.content.slice(0, 48) : '';
  }
  saveChats();
  if (chat === app.current) updateLast(answer, false);
  renderConvList();
  $('regen').disabled = false;
  $('cont').disabled = !canContinue();
}

function send() {
  const text = $('input').value;
  if (!text.trim() || app.busy) return;
  app.current.messages.push({ role: 'user', content: text });
  $('input').value = '';
  updateLastUser();
  generate();
}

function updateLastUser() {
  $('messages').appendChild(messageNode(app.current.messages[app.current.messages.length - 1], false));
}

function regenerate() {
  if (app.busy) return;
  const msgs = app.current.messages;
  while (msgs.length && msgs[msgs.length - 1].role === 'assistant') msgs.pop();
  if (!msgs.length) return;
  renderMessages();
  generate();
}

function continueAnswer() {
  if (app.busy || !canContinue()) return;
  generate(true);
}

function stop() {
  if (app.controller) app.controller.abort();
}

// ---- engine view ----

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// sizes a canvas's backing store to its CSS box (sharp on high-DPI screens)
function fitCanvas(c, height) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.floor(c.clientWidth));
  if (height) c.style.height = height + 'px';
  const h = Math.max(1, Math.floor(c.clientHeight));
  if (c.width !== w * dpr || c.height !== h * dpr) {
    c.width = w * dpr;
    c.height = h * dpr;
  }
  const ctx = c.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

function drawKv(kv) {
  const c = $('kv-grid');
  const n = kv.cells.length;
  const w0 = Math.max(1, c.clientWidth);
  // the largest square cell that fits n cells in the width, 6..18 px
  let size = 18;
  while (size > 6 && Math.ceil(n / Math.floor(w0 / size)) * size > 240) size--;
  const cols = Math.max(1, Math.floor(w0 / size));
  const rows = Math.ceil(n / cols);
  const { ctx } = fitCanvas(c, rows * size + 2);
  const colors = [cssVar('--free'), cssVar('--cached'), cssVar('--used')];
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = colors[kv.cells.charCodeAt(i) - 48] || colors[0];
    ctx.fillRect((i % cols) * size + 1, Math.floor(i / cols) * size + 1, size - 2, size - 2);
  }
  c.dataset.used = String(kv.used);
}

function axisLabel(ctx, text, x, y) {
  ctx.fillStyle = cssVar('--muted');
  ctx.font = '11px system-ui, sans-serif';
  ctx.fillText(text, x, y);
}

function drawSteps(steps) {
  const { ctx, w, h } = fitCanvas($('chart-steps'));
  const max = Math.max(1, ...steps.map((s) => s.prefill + s.decode));
  const n = 64;
  const bw = w / n;
  const top = 14;
  steps.forEach((s, i) => {
    const x = (n - steps.length + i) * bw;
    const hp = ((h - top) * s.prefill) / max;
    const hd = ((h - top) * s.decode) / max;
    ctx.fillStyle = cssVar('--decode');
    ctx.fillRect(x + 1, h - hd, Math.max(1, bw - 2), hd);
    ctx.fillStyle = cssVar('--prefill');
    ctx.fillRect(x + 1, h - hd - hp, Math.max(1, bw - 2), hp);
  });
  axisLabel(ctx, 'max ' + max + ' tokens/step', 4, 11);
}

function drawLine(id, values, color, unit) {
  const { ctx, w, h } = fitCanvas($(id));
  const nums = values.filter((v) => v !== null);
  const max = Math.max(1, ...nums);
  const top = 14;
  ctx.strokeStyle = cssVar('--line');
  ctx.beginPath();
  ctx.moveTo(0, h - 0.5);
  ctx.lineTo(w, h - 0.5);
  ctx.stroke();
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let pen = false;
  values.forEach((v, i) => {
    if (v === null) {
      pen = false;
      return;
    }
    const x = (i / (values.length - 1)) * w;
    const y = h - 1 - ((h - top - 1) * v) / max;
    if (pen) ctx.lineTo(x, y);
    else ctx.moveTo(x, y);
    pen = true;
  });
  ctx.stroke();
  axisLabel(ctx, 'max ' + Math.round(max) + ' ' + unit, 4, 11);
  axisLabel(ctx, '-3 min', 4, h - 4);
}

function td(text, cls) {
  return el('td', cls, text);
}

function renderEngine(st) {
  $('eng-running').textContent = st.running;
  $('eng-waiting').textContent = st.waiting;
  $('eng-kv').textContent = st.kv.used + ' / ' + st.kv.blocks;
  $('eng-hit').textContent = (st.prefix_cache.hit_rate * 100).toFixed(1) + '%';
  $('eng-preempt').textContent = st.preemptions;
  const gen = st.history.generated;
  // the last complete second (the current one is still filling)
  $('eng-tps').textContent = gen.length > 1 ? gen[gen.length - 2] : 0;
  $('kv-caption').textContent =
    st.kv.blocks + ' blocks of ' + st.kv.block_size + ' tokens' +
    (st.kv.blocks_per_cell > 1 ? ', ' + st.kv.blocks_per_cell + ' blocks a cell' : '') +
    ', ' + st.kv.cached_free + ' cached free, peak ' + st.kv.peak;
  drawKv(st.kv);
  const body = $('req-body');
  body.replaceChildren();
  for (const r of st.requests) {
    const tr = el('tr', 'req-row');
    tr.dataset.state = r.state;
    const badge = el('span', 'badge ' + r.state, r.state + (r.paused ? ' (paused)' : ''));
    const state = el('td');
    state.appendChild(badge);
    tr.append(td(String(r.id)), state, td(String(r.prompt_tokens)),
      td(String(r.computed_tokens)), td(r.generated_tokens + ' / ' + r.max_tokens),
      td(String(r.blocks)), td(r.age_s.toFixed(1) + ' s'));
    body.appendChild(tr);
  }
  $('req-empty').hidden = st.requests.length > 0;
  drawSteps(st.steps);
  drawLine('chart-tps', gen, cssVar('--decode'), 'tok/s');
  drawLine('chart-ttft', st.history.ttft_ms, cssVar('--accent'), 'ms');
  $('eng-footer').textContent =
    'snapshot ' + st.version + ', ' + (st.age_s * 1000).toFixed(0) + ' ms old; ' + st.steps_total +
    ' steps; keeping it costs the engine ' + (st.cost.step_ns_avg / 1000).toFixed(1) +
    ' \u00b5s a step on average (max ' + (st.cost.step_ns_max / 1000).toFixed(1) + ' \u00b5s)';
}

async function pollEngine(gen) {
  if ($('view-engine').hidden || gen !== app.pollGen) return;
  try {
    const r = await apiFetch('/v1/engine/state');
    if (r.ok) renderEngine(await r.json());
    else $('eng-footer').textContent = 'engine state: HTTP ' + r.status;
  } catch (e) {
    $('eng-footer').textContent = 'engine state: ' + String(e.message || e);
  }
  if (!$('view-engine').hidden && gen === app.pollGen)
    app.enginePoll = setTimeout(() => pollEngine(gen), 250);
}

// ---- layout ----

function showTab(name) {
  const chat = name === 'chat';
  $('view-chat').hidden = !chat;
  $('view-engine').hidden = chat;
  $('tab-chat').classList.toggle('active', chat);
  $('tab-engine').classList.toggle('active', !chat);
  $('tab-chat').setAttribute('aria-selected', String(chat));
  $('tab-engine').setAttribute('aria-selected', String(!chat));
  $('menu-toggle').hidden = !chat;
  restartPoll();
  if (chat) $('input').focus();
}

function restartPoll() {
  clearTimeout(app.enginePoll);
  app.pollGen++;
  if (!$('view-engine').hidden) pollEngine(app.pollGen);
}

function closeDrawer() {
  $('sidebar').classList.remove('open');
}

async function init() {
  restoreSettings();
  app.chats = loadJSON(localStorage, CHATS_STORE, []).filter((c) => c && Array.isArray(c.messages));
  if (app.chats.length) app.current = app.chats[0];
  else newChat();
  renderConvList();
  renderMessages();

  $('composer').addEventListener('submit', (ev) => {
    ev.preventDefault();
    send();
  });
  $('input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', stop);
  $('regen').addEventListener('click', regenerate);
  $('cont').addEventListener('click', continueAnswer);
  $('new-chat').addEventListener('click', newChat);
  $('tab-chat').addEventListener('click', () => showTab('chat'));
  $('tab-engine').addEventListener('click', () => showTab('engine'));
  $('menu-toggle').addEventListener('click', () => $('sidebar').classList.toggle('open'));
  $('key-form').addEventListener('submit', onKeySubmit);
  for (const id of ['set-system', 'set-temp', 'set-top-p', 'set-max-tokens', 'set-seed'])
    $(id).addEventListener('change', saveSettings);
  window.addEventListener('resize', restartPoll);
  if (location.hash === '#engine') showTab('engine');

  try {
    const r = await fetch('/webui/config.json');
    if (r.ok) app.config = await r.json();
  } catch (e) {
    // the daemon is going away: the first request will say so
  }
  $('model-name').textContent = app.config.model || '';
  await ensureKey();
  await loadModels();
  document.body.dataset.ready = '1';
}

init();
