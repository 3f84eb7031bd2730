-- lecho.gateway.page: the live view lecho-gateway serves at GET /
-- (doc/gateway.md "The live view"): one HTML page, its script inline, no
-- framework, nothing fetched but its own WebSocket (/ws on the same host).
-- Channels of the name server (op list), a channel's events as they come,
-- a numeric field of the events drawn as a heat map with its colour scale,
-- every viewer's events, bytes and rate (op clients), and a steering form
-- that publishes with submit_sync and shows the answer or the error.
return [==[<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lecho live view</title>
<link rel="icon" type="image/svg+xml" href="/favicon.svg">
<style>
:root { --bg:#0f1419; --panel:#182028; --line:#2a3540; --fg:#d8e0e8; --dim:#8a98a8; --acc:#4fb3ff; --bad:#ff6b6b; --ok:#5fd38d; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg); font:14px/1.4 system-ui, sans-serif; }
header { display:flex; align-items:center; gap:16px; padding:10px 18px; border-bottom:1px solid var(--line); }
header h1 { font-size:17px; margin:0; font-weight:600; }
header .me { color:var(--dim); margin-left:auto; font-variant-numeric:tabular-nums; }
#status { padding:2px 8px; border-radius:10px; font-size:12px; background:#333; }
#status.up { background:#1d4d33; color:var(--ok); } #status.down { background:#4d1d1d; color:var(--bad); }
main { display:grid; grid-template-columns: 250px 1fr 340px; gap:12px; padding:12px; }
section { background:var(--panel); border:1px solid var(--line); border-radius:8px; padding:10px 12px; min-width:0; }
h2 { font-size:13px; text-transform:uppercase; letter-spacing:.06em; color:var(--dim); margin:0 0 8px; font-weight:600; }
ul { list-style:none; margin:0; padding:0; }
#channels li { padding:5px 6px; border-radius:5px; cursor:pointer; display:flex; justify-content:space-between; gap:6px; }
#channels li:hover { background:#22303c; } #channels li.sub { background:#1b3a55; }
#channels .n { color:var(--dim); font-size:12px; white-space:nowrap; }
#channels li.hint { display:block; cursor:auto; color:var(--fg); margin-top:8px; }
#channels li.hint form { gap:6px; } #channels li.hint:hover { background:none; }
#channels li > span:first-child { min-width:0; overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
#field-head { display:flex; gap:12px; align-items:baseline; flex-wrap:wrap; color:var(--dim); font-size:13px; }
#field-head b { color:var(--fg); font-weight:600; }
canvas#heat { width:100%; image-rendering:pixelated; border-radius:4px; background:#000; display:block; margin-top:6px; }
#scale { display:flex; flex-wrap:wrap; align-items:center; gap:4px 8px; margin-top:6px; font-size:12px; color:var(--dim); font-variant-numeric:tabular-nums; }
canvas#legend { flex:1 1 120px; min-width:0; width:100px; height:12px; border-radius:3px; }
#scale .nf { white-space:nowrap; }
#scale .sw { display:inline-block; width:10px; height:10px; border-radius:2px; margin-left:6px; }
#events { font:12px/1.35 ui-monospace, monospace; max-height:230px; overflow:auto; margin-top:8px; }
#events li { padding:2px 0; border-bottom:1px solid #1f2a33; white-space:nowrap; overflow:hidden; text-overflow:ellipsis; }
table { width:100%; border-collapse:collapse; font-size:12px; font-variant-numeric:tabular-nums; }
th, td { text-align:right; padding:3px 4px; border-bottom:1px solid var(--line); } th:first-child, td:first-child { text-align:left; }
tr.you td { color:var(--acc); }
form { display:grid; gap:6px; }
input, textarea, select, button { font:inherit; color:var(--fg); background:#0f151b; border:1px solid var(--line); border-radius:5px; padding:5px 7px; }
textarea { font-family:ui-monospace, monospace; font-size:12px; min-height:54px; }
button { background:#1f5f99; border-color:#2a78bf; cursor:pointer; } button:hover { background:#2670b3; }
#answer { font:12px ui-monospace, monospace; padding:6px; border-radius:5px; background:#0f151b; min-height:2em; white-space:pre-wrap; word-break:break-all; }
#answer.ok { color:var(--ok); } #answer.err { color:var(--bad); }
.right { display:grid; gap:12px; align-content:start; }
/* narrower windows: the field gets the room, the viewers and the form go
   below it (side by side), then everything in one column */
@media (max-width: 1100px) {
  main { grid-template-columns: 230px minmax(0, 1fr); }
  .right { grid-column: 1 / -1; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); }
}
@media (max-width: 620px) { main { grid-template-columns: minmax(0, 1fr); } }
</style></head>
<body>
<header><h1>lecho live view</h1><span id="status">connecting</span>
<span class="me" id="me"></span></header>
<main>
<section><h2>Channels</h2><ul id="channels"><li class="n">…</li></ul></section>
<section>
  <h2 id="title">Field</h2>
  <div id="field-head"><span>channel <b id="fch">—</b></span><span>step <b id="fstep">—</b></span>
    <span>grid <b id="fgrid">—</b></span><label>level <select id="level"></select></label>
    <span>events <b id="fcount">0</b></span></div>
  <canvas id="heat" width="72" height="36"></canvas>
  <div id="scale"><span id="smin">—</span><canvas id="legend" width="256" height="1"></canvas><span id="smax">—</span>
    <span class="nf"><span class="sw" style="background:rgb(255,0,255)"></span> NaN
    <span class="sw" style="background:rgb(255,255,255)"></span> +inf
    <span class="sw" style="background:rgb(0,0,0);border:1px solid #555"></span> −inf <span id="snf"></span></span></div>
  <h2 style="margin-top:12px">Events</h2><ul id="events"></ul>
</section>
<div class="right">
<section><h2>Viewers</h2><table><thead><tr><th>client</th><th>events</th><th>ev/s</th><th>kB</th><th>kB/s</th><th>drops</th></tr></thead>
<tbody id="viewers"></tbody></table></section>
<section><h2>Steer (submit_sync)</h2>
<form id="steer"><input id="sch" value="atmosphere.steer" aria-label="channel">
<textarea id="sval" aria-label="value">{"emission": 4}</textarea>
<button type="submit" id="sbtn">submit_sync</button></form>
<div id="answer"></div></section>
</div>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const q = new URLSearchParams(location.search);
let ws, nextId = 1, pending = {}, subscribed = null, evCount = 0, field = null;
const view = { frames: 0, last: null, binary: 0, typed: null };
window.lechoView = view;   // read by the browser spec

function send(m) { return new Promise((res) => { m.id = nextId++; pending[m.id] = res; ws.send(JSON.stringify(m)); }); }
// a request whose field `key` is raw JSON text sent as it is (the steering
// form's value: JSON.parse and JSON.stringify would round 9007199254740993,
// turn 1e400 into null, rewrite 12345678901234567890; sent as written, the
// gateway's number checks apply and its error comes back to this id).
// raw must be one JSON value (checked by the caller).
function sendRaw(m, key, raw) {
  return new Promise((res) => {
    m.id = nextId++; pending[m.id] = res;
    const head = JSON.stringify(m);
    ws.send(head.slice(0, -1) + (head.length > 2 ? "," : "") + JSON.stringify(key) + ":" + raw + "}");
  });
}

// a colour scale (viridis-like, 5 stops); values that are not finite have
// colours of their own, outside the scale (the legend says which)
const STOPS = [[68,1,84],[59,82,139],[33,145,140],[94,201,98],[253,231,37]];
const NAN_C = [255, 0, 255], PINF_C = [255, 255, 255], NINF_C = [0, 0, 0], NONE_C = [40, 40, 40];
function colour(t) {
  if (!(t >= 0)) t = 0;   // (NaN too: STOPS[NaN] is no colour)
  t = Math.min(1, t) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(t)), f = t - i, a = STOPS[i], b = STOPS[i + 1];
  return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
}
(function legend() {
  const c = $("legend"), g = c.getContext("2d"), im = g.createImageData(256, 1);
  for (let x = 0; x < 256; x++) { const k = colour(x / 255); im.data.set([k[0], k[1], k[2], 255], x * 4); }
  g.putImageData(im, 0, 0);
})();

// the numeric field of an event: ev.cells with ev.nlat x ev.nlon (levels ev.nlev),
// or ev.field, an array { dtype, shape, data } (the atmosphere simulation's),
// else the first array found: an array { dtype, shape, data } by its shape
// (2 or more dims: the last two a grid, the first the levels), a list of
// numbers or a typed array drawn as a square-ish grid.
// data a typed array (from a binary frame) or numbers (from JSON); <i8 and
// <u8 elements (BigInt) made numbers.
const isNums = (v) => (ArrayBuffer.isView(v) && !(v instanceof DataView)) ||
  (Array.isArray(v) && v.length > 0 && (typeof v[0] === "number" || v[0] === null));
const numeric = (d) => (d instanceof BigInt64Array || d instanceof BigUint64Array) ? Float64Array.from(d, Number) : d;
const isArr = (v) => v && typeof v === "object" && typeof v.dtype === "string" && Array.isArray(v.shape) && isNums(v.data);
function square(data) {
  const nx = Math.max(1, Math.ceil(Math.sqrt(data.length)));
  return { data: numeric(data), nx, ny: Math.max(1, Math.ceil(data.length / nx)), nz: 1 };
}
function ofArray(a) {
  const s = a.shape, n = s.length;
  if (n < 2) return square(a.data);
  let nz = 1;
  for (let i = 0; i < n - 2; i++) nz *= s[i];
  return { data: numeric(a.data), ny: s[n - 2], nx: s[n - 1], nz };
}
function findField(ev) {
  if (ev && isNums(ev.cells) && ev.nlat && ev.nlon)
    return { data: numeric(ev.cells), ny: ev.nlat, nx: ev.nlon, nz: ev.nlev || 1 };
  if (ev && isArr(ev.field)) return ofArray(ev.field);
  const walk = (v, d) => {
    if (isArr(v)) return ofArray(v);
    if (isNums(v) && v.length > 1) return square(v);
    if (v && typeof v === "object" && !ArrayBuffer.isView(v) && d < 4)
      for (const k in v) { const r = walk(v[k], d + 1); if (r) return r; }
    return null;
  };
  return walk(ev, 0);
}

function draw(f) {
  const c = $("heat");
  if (c.width !== f.nx || c.height !== f.ny) { c.width = f.nx; c.height = f.ny; }
  const sel = $("level");
  if (sel.options.length !== f.nz) {
    sel.innerHTML = "";
    for (let k = 0; k < f.nz; k++) sel.add(new Option(String(k + 1), String(k)));
  }
  const k = Math.min(+sel.value || 0, f.nz - 1), n = f.nx * f.ny, base = k * n;
  // the scale over the finite values only: NaN and infinities are counted
  // and drawn in their own colours
  let lo = Infinity, hi = -Infinity, nonfinite = 0;
  for (let i = 0; i < n; i++) {
    const v = f.data[base + i];
    if (typeof v !== "number") continue;
    if (Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; } else nonfinite++;
  }
  if (lo === Infinity) { lo = 0; hi = 1; }
  const span = hi > lo ? hi - lo : 1;
  const g = c.getContext("2d"), im = g.createImageData(f.nx, f.ny);
  for (let y = 0; y < f.ny; y++) for (let x = 0; x < f.nx; x++) {
    // row 0 of the field is the southernmost latitude: drawn at the bottom
    const v = f.data[base + y * f.nx + x], o = ((f.ny - 1 - y) * f.nx + x) * 4;
    const col = typeof v !== "number" ? NONE_C : Number.isNaN(v) ? NAN_C : v === Infinity ? PINF_C
      : v === -Infinity ? NINF_C : colour((v - lo) / span);
    im.data[o] = col[0]; im.data[o + 1] = col[1]; im.data[o + 2] = col[2]; im.data[o + 3] = 255;
  }
  g.putImageData(im, 0, 0);
  $("smin").textContent = lo.toPrecision(4); $("smax").textContent = hi.toPrecision(4);
  $("snf").textContent = nonfinite ? "(" + nonfinite + " not finite)" : "";
  $("fgrid").textContent = f.nz + "×" + f.ny + "×" + f.nx;
}
$("level").onchange = () => { if (field) draw(field); };
// another channel: nothing of the last one's field stays (review 7: its
// heat map, grid and step stayed under the new channel's name)
function clearField() {
  const c = $("heat");
  c.getContext("2d").clearRect(0, 0, c.width, c.height);
  for (const id of ["fstep", "fgrid", "smin", "smax"]) $(id).textContent = "—";
  $("snf").textContent = ""; $("fcount").textContent = "0"; $("level").innerHTML = "";
  view.last = null; view.typed = null;
}

// one line per event: a table's scalars as k=v (step and t first), arrays by their length
function summary(ev) {
  if (!ev || typeof ev !== "object" || Array.isArray(ev)) {
    const t = JSON.stringify(ev);
    return Array.isArray(ev) && ev.length > 20 ? "[" + ev.length + " values]" : t;
  }
  const keys = Object.keys(ev).sort((a, b) => (a === "step" ? -1 : b === "step" ? 1 : a === "t" ? -1 : b === "t" ? 1 : a < b ? -1 : 1));
  return keys.map((k) => {
    const v = ev[k];
    if (Array.isArray(v) || ArrayBuffer.isView(v)) return k + "=[" + v.length + "]";
    if (v && v.dtype && Array.isArray(v.shape)) return k + "=" + v.dtype + " " + v.shape.join("×");
    if (v && typeof v === "object") { try { return k + "=" + JSON.stringify(v); } catch (x) { return k + "={…}"; } }
    return k + "=" + (typeof v === "number" && !Number.isInteger(v) ? +v.toPrecision(6) : v);
  }).join("  ");
}

// A binary message: u32 little-endian length L, L bytes of JSON header
// { ch, ev (without its arrays), arrays: [{ path, dtype, shape, offset, bytes }] },
// zero bytes to a multiple of 8, the elements: viewed in place as typed
// arrays and put back into the event at their paths as { dtype, shape, data }.
const TYPED = { "<u1": Uint8Array, "<i1": Int8Array, "<u2": Uint16Array, "<i2": Int16Array,
  "<u4": Uint32Array, "<i4": Int32Array, "<u8": BigUint64Array, "<i8": BigInt64Array,
  "<f4": Float32Array, "<f8": Float64Array };
// A message without ch is a reply (a call's result holding arrays): the
// arrays go back into the reply itself.  A path's numbers are places in a
// list counted from 1 (Lua's): one less in a JavaScript array.
function fromBinary(buf) {
  const L = new DataView(buf).getUint32(0, true);
  const head = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, L)));
  const base = (4 + L + 7) & ~7;
  const reply = head.ch === undefined, arrays = head.arrays || [];
  let ev = reply ? head : head.ev;
  if (reply) delete head.arrays;
  const key = (t, k) => (Array.isArray(t) && typeof k === "number" ? k - 1 : k);
  for (const a of arrays) {
    const T = TYPED[a.dtype];
    if (!T) continue;
    const val = { dtype: a.dtype, shape: a.shape, data: new T(buf, base + a.offset, a.bytes / T.BYTES_PER_ELEMENT) };
    if (!reply) view.typed = val.data;
    if (!a.path.length) { ev = val; continue; }
    if (!ev || typeof ev !== "object") ev = {};
    let t = ev;
    for (let i = 0; i < a.path.length - 1; i++) {
      const k = key(t, a.path[i]);
      if (!t[k] || typeof t[k] !== "object") t[k] = {};
      t = t[k];
    }
    t[key(t, a.path[a.path.length - 1])] = val;
  }
  return reply ? { reply: ev } : { ch: head.ch, ev };
}

function onEvent(m) {
  evCount++; view.frames++; view.last = m.ev;
  $("fcount").textContent = evCount;
  if (m.ev && m.ev.step !== undefined) $("fstep").textContent = m.ev.step;
  const f = findField(m.ev);
  if (f) { field = f; draw(f); }
  const li = document.createElement("li");
  const text = summary(m.ev);
  li.textContent = text.length > 300 ? text.slice(0, 300) + "…" : text;
  const ul = $("events"); ul.prepend(li);
  while (ul.children.length > 50) ul.lastChild.remove();
}

async function subscribe(name) {
  if (subscribed === name) return;
  if (subscribed) await send({ op: "unsub", ch: subscribed });
  subscribed = name; evCount = 0; field = null;
  $("events").innerHTML = ""; $("fch").textContent = name;
  clearField();
  const r = await send({ op: "sub", ch: name });
  if (r.error) { $("fch").textContent = name + " (" + r.error + ")"; subscribed = null; }
  else { q.set("ch", name); history.replaceState(null, "", "?" + q.toString()); }   // a reload or a shared link opens it
  listChannels();
}

// the field to open a channel by name (review 3: a principal that may
// consume but not list; review 6: one whose list comes back empty), kept
// in the address as ?ch=NAME, as doc/gateway.md says
function openField(ul) {
  const li = document.createElement("li"); li.className = "n hint";
  li.innerHTML = "<form id=open>Open a channel by name (or add <code>?ch=NAME</code> to this address):" +
    "<input id=chname aria-label=channel placeholder=channel><button type=submit>open</button></form>";
  ul.appendChild(li);
  if (subscribed) $("chname").value = subscribed;
  $("open").onsubmit = (e) => {
    e.preventDefault();
    const name = $("chname").value.trim();
    if (!name) return;
    subscribe(name);
  };
}

async function listChannels() {
  const r = await send({ op: "list" });
  const ul = $("channels");
  // a result that is not an array (an older gateway wrote an empty list as
  // {}: review 5) is no channel, and ?ch= is still subscribed
  const chans = r.error ? null : (Array.isArray(r.result) ? r.result : []);
  // still refused or still empty: the field stays, with what is typed in it
  if ($("open") && (r.error ? r.code !== "closed" : chans.length === 0)) return;
  ul.innerHTML = "";
  if (r.error) {
    ul.innerHTML = "<li class=n></li>"; ul.firstChild.textContent = r.error;
    if (r.code !== "closed") openField(ul);   // refused: the view is used by name
    return;
  }
  if (chans.length === 0) {
    ul.innerHTML = "<li class=n>No channel to show: none, or none this view may list.</li>";
    openField(ul);
  }
  for (const c of chans) {
    const li = document.createElement("li"); li.dataset.channel = c.channel;
    if (c.channel === subscribed) li.className = "sub";
    li.innerHTML = "<span></span><span class=n></span>";
    li.firstChild.textContent = c.channel;
    li.title = c.channel;
    li.lastChild.textContent = c.producers + "p · " + c.consumers + "c";
    li.onclick = () => subscribe(c.channel);
    ul.appendChild(li);
  }
  if (!subscribed && !view.autoDone) {
    view.autoDone = true;
    const want = q.get("ch") || (chans.find((c) => c.channel === "atmosphere.field") || {}).channel;
    if (want) subscribe(want);
  }
}

const kb = (n) => (n / 1000).toFixed(1);
async function viewers() {
  const r = await send({ op: "clients" });
  if (r.error) return;
  const tb = $("viewers"); tb.innerHTML = "";
  for (const c of (Array.isArray(r.result) ? r.result : [])) {
    const tr = document.createElement("tr"); if (c.you) tr.className = "you";
    for (const v of [(c.you ? "you · " : "") + c.kind + " " + c.id + (c.principal ? " (" + c.principal + ")" : ""),
                     c.events, c.rate, kb(c.bytes), kb(c.bps), c.drops]) {
      const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
    }
    tb.appendChild(tr);
    if (c.you) $("me").textContent = "this view: " + kb(c.bytes) + " kB, " + kb(c.bps) + " kB/s, " + c.rate + " ev/s";
  }
}

$("steer").onsubmit = async (e) => {
  e.preventDefault();
  const a = $("answer"); a.className = ""; a.textContent = "…";
  // checked for JSON syntax only, and sent as written (sendRaw)
  const raw = $("sval").value;
  try { JSON.parse(raw); } catch (x) { a.className = "err"; a.textContent = "not JSON: " + x.message; return; }
  const r = await sendRaw({ op: "pub", ch: $("sch").value, sync: true }, "data", raw);
  if (r.error) { a.className = "err"; a.textContent = "error (" + r.code + "): " + r.error; }
  else { a.className = "ok"; a.textContent = "true: every consumer ran its handler"; }
  view.steered = r;
};

function connect() {
  const tok = q.get("token");
  ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws" + (tok ? "?token=" + encodeURIComponent(tok) : ""));
  ws.onopen = () => { $("status").textContent = "connected"; $("status").className = "up"; };
  ws.onclose = (e) => {
    $("status").textContent = "closed" + (e.reason ? ": " + e.reason : "") + " — retrying";
    $("status").className = "down";
    for (const id in pending) pending[id]({ error: "connection closed", code: "closed" });
    pending = {}; subscribed = null; view.autoDone = false;
    setTimeout(connect, 2000);
  };
  ws.binaryType = "arraybuffer";
  ws.onmessage = (e) => {
    if (typeof e.data !== "string") {   // an event holding arrays (doc/gateway.md "Arrays")
      const m = fromBinary(e.data);
      view.binary++;
      if (m.reply) { const f = pending[m.reply.id]; if (f) { delete pending[m.reply.id]; f(m.reply); } }
      else if (m.ch !== undefined) onEvent(m);
      return;
    }
    const m = JSON.parse(e.data);
    if (m.id !== undefined && pending[m.id]) { const f = pending[m.id]; delete pending[m.id]; f(m); }
    else if (m.hello) {
      // ?ch= is subscribed at once: a principal that may consume but not
      // list uses the view too (the default, atmosphere.field, needs list)
      const want = q.get("ch");
      if (want && !view.autoDone) { view.autoDone = true; subscribe(want); } else listChannels();
    }
    else if (m.ch !== undefined && m.ev !== undefined) onEvent(m);
    else if (m.dropped) { const li = document.createElement("li"); li.textContent = "(" + m.dropped + " events dropped: this view is slow)"; $("events").prepend(li); }
  };
}
connect();
setInterval(() => { if (ws.readyState === 1) { viewers(); } }, 1000);
setInterval(() => { if (ws.readyState === 1) { listChannels(); } }, 5000);
</script>
</body></html>
]==]
