/* coadapt dashboard: a dependency-free single-page app (hash router, SVG charts, polling).
 *
 * It talks only to the controller that served it, with the same bearer token as the CLI
 * (kept in localStorage; "/#token=..." stores one). Every page re-fetches its data every
 * POLL_MS, so job states change on screen without a reload. DOM is built with textContent
 * only (job names, log lines and messages are never parsed as HTML).
 */
'use strict';

const POLL_MS = 2000;
const TOKEN_KEY = 'coadapt.token';
const S = { token: '', me: null, features: null, page: null, timer: null, seq: 0 };

// ---------------------------------------------------------------- DOM helpers
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, kids);
  return el;
}
const SVGNS = 'http://www.w3.org/2000/svg';
function sv(tag, attrs, ...kids) {
  const el = document.createElementNS(SVGNS, tag);
  setAttrs(el, attrs);
  append(el, kids);
  return el;
}
function setAttrs(el, attrs) {
  if (!attrs) return;
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.setAttribute('class', v);
    else if (k === 'style') Object.assign(el.style, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}
function append(el, kids) {
  for (const c of kids.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

// ---------------------------------------------------------------- formatting
const isNum = (x) => typeof x === 'number' && Number.isFinite(x);
function fmt(x, digits = 3) {
  if (!isNum(x)) return '—';
  const a = Math.abs(x);
  if (a >= 1e6) return (x / 1e6).toFixed(a >= 1e7 ? 1 : 2) + 'M';
  if (a >= 1e4) return (x / 1e3).toFixed(a >= 1e5 ? 0 : 1) + 'k';
  if (Number.isInteger(x)) return String(x);
  if (a >= 100) return x.toFixed(0);
  return Number(x.toPrecision(digits)).toString();
}
function dur(s) {
  if (!isNum(s)) return '—';
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + String(s % 60).padStart(2, '0') + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + String(Math.floor(s / 60) % 60).padStart(2, '0') + 'm';
  return Math.floor(s / 86400) + 'd ' + Math.floor(s / 3600) % 24 + 'h';
}
function clock(t) {
  if (!isNum(t)) return '—';
  const d = new Date(t * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((v) => String(v).padStart(2, '0')).join(':');
}
function hashHue(text) {
  let x = 2166136261;
  for (let i = 0; i < text.length; i++) { x ^= text.charCodeAt(i); x = Math.imul(x, 16777619); }
  return (x >>> 0) % 360;
}
const jobColour = (id) => `hsl(${hashHue(id)},62%,46%)`;
const OTHER = '#aab2bd';
const PALETTE = ['#1f6feb', '#e8590c', '#2f9e44', '#c2255c', '#7048e8', '#0c8599', '#e67700', '#5c940d', '#862e9c', '#495057'];
const badge = (state) => h('span', { class: 'badge ' + state }, state);
const dot = (colour) => h('span', { class: 'dot', style: { background: colour } });

// ---------------------------------------------------------------- API
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function api(path) {
  const resp = await fetch(path, { headers: { Authorization: 'Bearer ' + S.token }, cache: 'no-store' });
  if (!resp.ok) {
    let message = resp.statusText;
    try { message = (await resp.json()).message || message; } catch (e) { /* not JSON */ }
    throw new ApiError(resp.status, message);
  }
  return resp.json();
}

// ---------------------------------------------------------------- charts
function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const n = raw / mag;
  return (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * mag;
}
function linearTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step = niceStep(hi - lo, count);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}
function timeTicks(lo, hi, count) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const step = steps.find((s) => (hi - lo) / s <= count) || 86400;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(v);
  return out;
}
function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    const v = Math.pow(10, e);
    if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
  }
  return out.length >= 2 ? out : [lo, hi];
}
function valueAt(points, x, step) {
  // the series' value at x: last point at or before x (step) or the nearest point
  let best = null;
  for (const p of points) {
    if (step) { if (p[0] <= x) best = p; else break; }
    else if (best === null || Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
  }
  return best;
}

/* plot({title, series:[{label, colour, points:[[x,y]], step, dash, dots, width}], x:{type:'time'|'linear'|'log', label},
 *       y:{label, min, max, log, fmt}, stack:false, xMin, xMax, height, empty}) -> element */
function plot(o) {
  const W = o.width || 640, H = o.height || 230, M = { l: 54, r: 14, t: 10, b: o.x && o.x.label ? 36 : 24 };
  const wrap = h('div', { class: 'chart' });
  if (o.title) wrap.append(h('div', { class: 'chart-title' }, h('span', null, o.title), o.note ? h('span', { class: 'sub' }, o.note) : null));
  let series = (o.series || []).filter((s) => s.points && s.points.some((p) => isNum(p[0]) && isNum(p[1])));
  if (!series.length) { wrap.append(h('div', { class: 'empty' }, o.empty || 'no data yet')); return wrap; }
  const xType = (o.x && o.x.type) || 'linear', yLog = o.y && o.y.log;
  if (o.stack) series = stackSeries(series, o.xMax);
  const xs = [], ys = [];
  for (const s of series) for (const p of s.points) {
    if (isNum(p[0]) && (xType !== 'log' || p[0] > 0)) xs.push(p[0]);
    if (isNum(p[1]) && (!yLog || p[1] > 0)) ys.push(p[1]);
    if (s.base) ys.push(0);
  }
  let x0 = o.xMin ?? Math.min(...xs), x1 = o.xMax ?? Math.max(...xs);
  if (!(x1 > x0)) { const pad = xType === 'time' ? 30 : Math.abs(x0) * 0.1 || 1; x0 -= xType === 'log' ? x0 / 2 : pad; x1 += pad; }
  let y0 = (o.y && isNum(o.y.min)) ? o.y.min : (yLog ? Math.min(...ys) : Math.min(0, ...ys));
  let y1 = (o.y && isNum(o.y.max)) ? o.y.max : Math.max(...ys);
  if (!(y1 > y0)) { y1 = y0 + (Math.abs(y0) || 1); if (yLog) y0 = y0 / 2; }
  if (!(o.y && isNum(o.y.max)) && !yLog) y1 += (y1 - y0) * 0.06;
  const tx = xType === 'log' ? (v) => Math.log10(v) : (v) => v;
  const ty = yLog ? (v) => Math.log10(v) : (v) => v;
  const X = (v) => M.l + (tx(v) - tx(x0)) / (tx(x1) - tx(x0)) * (W - M.l - M.r);
  const Y = (v) => H - M.b - (ty(v) - ty(y0)) / (ty(y1) - ty(y0)) * (H - M.t - M.b);
  const svg = sv('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  const g = sv('g', { class: 'grid' });
  const yfmt = (o.y && o.y.fmt) || ((v) => fmt(v));
  for (const v of yLog ? logTicks(y0, y1) : linearTicks(y0, y1, 5)) {
    g.append(sv('line', { x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v) }));
    g.append(sv('text', { x: M.l - 6, y: Y(v) + 3, 'text-anchor': 'end' }, yfmt(v)));
  }
  const xt = xType === 'time' ? timeTicks(x0, x1, 7) : xType === 'log' ? logTicks(x0, x1) : linearTicks(x0, x1, 7);
  const xfmt = (o.x && o.x.fmt) || (xType === 'time' ? clock : (v) => fmt(v));
  for (const v of xt) {
    g.append(sv('line', { x1: X(v), x2: X(v), y1: M.t, y2: H - M.b }));
    g.append(sv('text', { x: X(v), y: H - M.b + 13, 'text-anchor': 'middle' }, xfmt(v)));
  }
  svg.append(g);
  if (o.x && o.x.label) svg.append(sv('text', { x: (M.l + W - M.r) / 2, y: H - 4, 'text-anchor': 'middle' }, o.x.label));
  if (o.y && o.y.label) svg.append(sv('text', { x: 12, y: (M.t + H - M.b) / 2, transform: `rotate(-90 12 ${(M.t + H - M.b) / 2})`, 'text-anchor': 'middle' }, o.y.label));
  svg.append(sv('line', { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: '#9aa3ad' }));
  const clipId = 'c' + (++S.seq);
  svg.append(sv('clipPath', { id: clipId }, sv('rect', { x: M.l, y: M.t - 2, width: W - M.l - M.r, height: H - M.t - M.b + 4 })));
  const body = sv('g', { 'clip-path': `url(#${clipId})` });
  for (const s of series) {
    const pts = s.points.filter((p) => isNum(p[0]) && isNum(p[1]) && (xType !== 'log' || p[0] > 0) && (!yLog || p[1] > 0));
    if (!pts.length) continue;
    let d = '';
    pts.forEach((p, i) => {
      if (i === 0) d += `M${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
      else if (s.step) d += `H${X(p[0]).toFixed(1)}V${Y(p[1]).toFixed(1)}`;
      else d += `L${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
    });
    if (s.step && s.extend !== false && isNum(o.xMax)) d += `H${X(o.xMax).toFixed(1)}`;
    if (s.base) {
      const b = s.base;
      let back = `H${X(b[b.length - 1][0]).toFixed(1)}`;
      for (let i = b.length - 1; i >= 0; i--) back += `V${Y(b[i][1]).toFixed(1)}H${X(b[i][0]).toFixed(1)}`;
      body.append(sv('path', { d: d + back + 'Z', fill: s.colour, 'fill-opacity': s.other ? 0.55 : 0.8, stroke: 'none' }));
    } else {
      body.append(sv('path', { d, fill: 'none', stroke: s.colour, 'stroke-width': s.width || 1.6, 'stroke-dasharray': s.dash || null, 'stroke-linejoin': 'round' }));
    }
    if (s.dots) for (const p of pts) body.append(sv('circle', { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: s.colour, stroke: '#fff', 'stroke-width': 0.8 }));
  }
  svg.append(body);
  // hover readout: a cursor line and every series' value at that x
  const cursor = sv('line', { y1: M.t, y2: H - M.b, stroke: '#1d2430', 'stroke-opacity': 0, 'stroke-dasharray': '3 3' });
  svg.append(cursor);
  const tip = h('div', { class: 'tip' });
  const overlay = sv('rect', { x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, fill: 'transparent' });
  overlay.addEventListener('mousemove', (ev) => {
    const r = svg.getBoundingClientRect();
    const px = (ev.clientX - r.left) * W / r.width;
    const f = (px - M.l) / (W - M.l - M.r);
    const xv = xType === 'log' ? Math.pow(10, tx(x0) + f * (tx(x1) - tx(x0))) : x0 + f * (x1 - x0);
    cursor.setAttribute('x1', px); cursor.setAttribute('x2', px); cursor.setAttribute('stroke-opacity', 0.5);
    tip.replaceChildren(h('div', null, xfmt(xv)));
    for (const s of (o.stack ? series.slice().reverse() : series)) {
      const p = valueAt(s.raw || s.points, xv, s.step);
      if (p) tip.append(h('div', null, dot(s.colour), `${s.label}: ${yfmt(p[1])}`));
    }
    tip.style.display = 'block';
    const left = (ev.clientX - r.left) + 14;
    tip.style.left = (left > r.width * 0.6 ? left - tip.offsetWidth - 28 : left) + 'px';
    tip.style.top = Math.max(0, ev.clientY - r.top - 10) + 'px';
  });
  overlay.addEventListener('mouseleave', () => { tip.style.display = 'none'; cursor.setAttribute('stroke-opacity', 0); });
  svg.append(overlay);
  wrap.append(svg, tip);
  if (o.legend !== false && series.length > 1 || o.legend === true) {
    wrap.append(h('div', { class: 'legend' }, series.map((s) => h('span', null, dot(s.colour), s.label))));
  }
  return wrap;
}
function stackSeries(series, xMax) {
  // step functions stacked on a common time grid: each gets a top (points) and a base
  const grid = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  if (isNum(xMax) && grid[grid.length - 1] < xMax) grid.push(xMax);
  let below = grid.map((t) => [t, 0]);
  return series.map((s) => {
    const top = grid.map((t, i) => { const p = valueAt(s.points, t, true); return [t, below[i][1] + (p ? p[1] : 0)]; });
    const out = { ...s, raw: s.points, points: top, base: below, step: true };
    below = top;
    return out;
  });
}

// ---------------------------------------------------------------- shell, auth, router
function setStatus(text) { document.getElementById('status').textContent = text; }
function showWho() {
  const who = document.getElementById('who');
  who.replaceChildren();
  if (!S.me) return;
  who.append(h('span', null, 'signed in as ', h('b', null, S.me.name), S.me.admin ? ' (admin)' : ''),
    h('button', { onclick: () => { localStorage.removeItem(TOKEN_KEY); S.token = ''; S.me = null; route(); } }, 'sign out'));
}
function loginPage(root, message) {
  const input = h('input', { type: 'password', placeholder: 'API token', autocomplete: 'off', id: 'token-input' });
  const go = async () => {
    S.token = input.value.trim();
    localStorage.setItem(TOKEN_KEY, S.token);
    S.me = null;
    route();
  };
  input.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') go(); });
  root.replaceChildren(h('div', { class: 'panel login' },
    h('h1', null, 'Sign in'),
    message ? h('div', { class: 'error' }, message) : null,
    h('p', null, 'Paste a tenant API token (or the admin token from ', h('span', { class: 'mono' }, 'STATE_DIR/admin-token'),
      '). It is kept in this browser only and sent as ', h('span', { class: 'mono' }, 'Authorization: Bearer'), '.'),
    input, h('button', { class: 'primary', id: 'token-save', onclick: go }, 'Sign in')));
  input.focus();
}

const ROUTES = [
  [/^#\/cluster$/, 'cluster', (r) => clusterPage(r)],
  [/^#\/jobs$/, 'jobs', (r) => jobsPage(r)],
  [/^#\/jobs\/([^/?#]+)$/, 'jobs', (r, m) => jobPage(r, decodeURIComponent(m[1]))],
  [/^#\/experiments$/, 'experiments', (r) => experimentsPage(r)],
  [/^#\/experiments\/([^/?#]+)$/, 'experiments', (r, m) => experimentPage(r, decodeURIComponent(m[1]))],
  [/^#\/simulations$/, 'simulations', (r) => simulationsPage(r)],
];

async function route() {
  clearTimeout(S.timer);
  S.page = null;
  const root = document.getElementById('main');
  const hash = location.hash || '#/cluster';
  if (hash.startsWith('#token=')) {
    S.token = decodeURIComponent(hash.slice(7));
    localStorage.setItem(TOKEN_KEY, S.token);
    S.me = null;
    history.replaceState(null, '', location.pathname + '#/cluster');
    return route();
  }
  if (!S.token) { showWho(); setStatus('not signed in'); return loginPage(root); }
  if (!S.me) {
    try {
      S.me = await api('/api/v1/whoami');
      S.features = await api('/api/v1/ui/features');
    } catch (e) {
      S.me = null;
      showWho();
      return loginPage(root, e.status === 401 ? 'That token was not accepted.' : 'Cannot reach the controller: ' + e.message);
    }
    showWho();
  }
  let page = null;
  for (const [re, name, make] of ROUTES) {
    const m = hash.match(re);
    if (m) {
      for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.page === name);
      root.replaceChildren();
      page = make(root, m);
      break;
    }
  }
  if (!page) { location.hash = '#/cluster'; return; }
  S.page = page;
  tick(page);
}
async function tick(page) {
  if (S.page !== page) return;
  try {
    await page.refresh();
    setStatus(`updated ${clock(Date.now() / 1000)} · refreshing every ${POLL_MS / 1000} s`);
  } catch (e) {
    if (S.page !== page) return;
    page.fail ? page.fail(e) : setStatus('error: ' + e.message);
    if (e.status === 401) { S.me = null; S.token = ''; localStorage.removeItem(TOKEN_KEY); return route(); }
  }
  if (S.page === page && page.poll !== false) S.timer = setTimeout(() => tick(page), POLL_MS);
}

function errorBox(slot, e) {
  slot.replaceChildren(h('div', { class: 'error' }, e.message));
}

// ---------------------------------------------------------------- cluster page
function clusterPage(root) {
  let window_s = 1800;
  const cards = h('div', { class: 'cards' });
  const nodesBox = h('div', { class: 'nodes' });
  const utilBox = h('div');
  const jobsBox = h('div', { class: 'scroll' });
  const deployBox = h('div', { class: 'scroll' }); // deploy.js fills it
  const msg = h('div');
  const sel = h('select', { id: 'util-window', onchange: () => { window_s = Number(sel.value); tick(page); } },
    [[300, 'last 5 min'], [1800, 'last 30 min'], [7200, 'last 2 h'], [86400, 'last 24 h']].map(([v, t]) => h('option', { value: v, selected: v === window_s }, t)));
  root.append(h('h1', null, 'Cluster'), msg, cards,
    h('div', { class: 'panel' }, h('h2', null, 'Nodes and slots ', h('span', { class: 'sub' }, 'who holds each slot now; other tenants are anonymised')), nodesBox),
    h('div', { class: 'panel' }, h('h2', null, 'Utilisation ', sel), utilBox),
    h('div', { class: 'panel' }, h('h2', null, 'Active jobs'), jobsBox),
    h('div', { class: 'panel', id: 'deployments-panel' }, h('h2', null, 'Deployments ', h('span', { class: 'sub' }, 'serving replicas share the slots with training')), deployBox));
  const page = {
    async refresh() {
      const [cl, ui, sv] = await Promise.all([api('/api/v1/cluster'), api(`/api/v1/ui/cluster?window=${window_s}`), servingData()]);
      msg.replaceChildren();
      const running = cl.jobs.filter((j) => j.state === 'RUNNING' || j.state === 'RESCALING').length;
      const pending = cl.jobs.filter((j) => j.state === 'PENDING').length;
      const round = cl.round || {};
      cards.replaceChildren(
        card('slots used', `${cl.used} / ${cl.slots}`, ''),
        card('utilisation', fmt(100 * cl.used / Math.max(cl.slots, 1), 3), '%'),
        card(S.me.admin ? 'running' : 'running (yours)', running, 'jobs'), card(S.me.admin ? 'pending' : 'pending (yours)', pending, 'jobs'),
        card('policy', cl.policy, ''),
        card('rounds', isNum(round.count) ? round.count : '—', isNum(round.at) ? 'last ' + clock(round.at) : ''));
      // nodes: the API's inventory, plus any node only the replica rows name
      const nodes = new Map((cl.nodes || []).map((n) => [n.name, { name: n.name, slots: n.slots, gpu_type: n.gpu_type, held: [] }]));
      for (const r of [...ui.replicas, ...servingSlots(sv)]) {
        if (!nodes.has(r.node)) nodes.set(r.node, { name: r.node, slots: 0, held: [] });
        const n = nodes.get(r.node);
        n.held.push(r);
        n.slots = Math.max(n.slots, r.slot + 1);
      }
      nodesBox.replaceChildren(...[...nodes.values()].map(nodeCard));
      deployBox.replaceChildren(sv ? deploymentsTable(sv.deployments) : h('div', { class: 'empty' }, 'no deployment routes on this controller'));
      if (!nodes.size) nodesBox.append(h('div', { class: 'empty' }, 'no nodes'));
      const series = ui.utilisation.jobs.map((s) => ({
        label: s.other ? 'other tenants' : s.name, colour: s.other ? OTHER : jobColour(s.job_id), points: s.points, step: true, other: s.other,
      }));
      utilBox.replaceChildren(plot({
        series, stack: true, width: 1280, height: 260, x: { type: 'time' }, y: { label: 'slots held', min: 0, max: Math.max(cl.slots, 1) },
        xMin: ui.utilisation.start, xMax: ui.utilisation.end, legend: true, empty: 'no slots held in this window',
      }));
      jobsBox.replaceChildren(cl.jobs.length ? h('table', { class: 't', id: 'cluster-jobs' },
        h('thead', null, h('tr', null, ['job', 'tenant', 'state', 'replicas', 'slots', 'batch', 'goodput', 'speedup'].map((c, i) => h('th', { class: i > 2 ? 'n' : '' }, c)))),
        h('tbody', null, cl.jobs.map((j) => h('tr', null,
          h('td', null, dot(jobColour(j.id)), h('a', { href: '#/jobs/' + encodeURIComponent(j.id) }, j.name)),
          h('td', null, j.tenant), h('td', null, badge(j.state)),
          h('td', { class: 'n' }, `${j.replicas} → ${j.desired_replicas}`),
          h('td', { class: 'n mono' }, (j.slots || []).join(',') || '—'),
          h('td', { class: 'n' }, fmt(j.batch_size)), h('td', { class: 'n' }, fmt(j.goodput)),
          h('td', { class: 'n' }, isNum(j.speedup) ? fmt(j.speedup) + '×' : '—'))))) : h('div', { class: 'empty' }, 'no active jobs'));
    },
    fail(e) { errorBox(msg, e); },
  };
  return page;
}
function card(k, v, u) {
  return h('div', { class: 'card' }, h('div', { class: 'k' }, k), h('div', { class: 'v' }, String(v), u ? h('span', { class: 'u' }, u) : null));
}
function nodeCard(n) {
  const bySlot = new Map(n.held.map((r) => [r.slot, r]));
  const sharing = new Map(); // GPU sharing: replicas of two packed jobs on one slot
  for (const r of n.held) sharing.set(r.slot, (sharing.get(r.slot) || 0) + 1);
  const used = bySlot.size;
  const slots = [];
  for (let i = 0; i < n.slots; i++) {
    const r = bySlot.get(i);
    if (!r) slots.push(h('div', { class: 'slot free', 'data-slot': i }, h('span', { class: 'idx' }, '#' + i), h('span', { class: 'nm' }, 'free')));
    else if (r.serving) slots.push(servingSlotCard(i, r)); // deploy.js
    else if (r.other) slots.push(h('div', { class: 'slot other ' + r.status, 'data-slot': i, title: 'held by another tenant' }, h('span', { class: 'idx' }, '#' + i), h('span', { class: 'nm' }, 'other tenant')));
    else slots.push(h('a', { class: 'slot ' + r.status, 'data-slot': i, href: '#/jobs/' + encodeURIComponent(r.job_id), style: { background: jobColour(r.job_id) }, title: `${r.name} (${r.job_id}) rank ${r.rank}, ${r.status}` },
      h('span', { class: 'idx' }, `#${i} · rank ${r.rank}`), h('span', { class: 'nm' }, r.name), h('span', { class: 'idx' }, r.tenant), sharing.get(i) > 1 ? h('span', { class: 'idx shared' }, `shared by ${sharing.get(i)} jobs`) : null));
  }
  return h('div', { class: 'node', 'data-node': n.name }, h('div', { class: 'head' }, h('span', null, n.name, n.gpu_type ? h('span', { class: 'sub gpu-type', 'data-gpu-type': n.gpu_type }, ' ' + n.gpu_type) : null), h('span', { class: 'sub' }, `${used}/${n.slots} used`)), h('div', { class: 'slots' }, slots));
}

// ---------------------------------------------------------------- jobs page
const STATES = ['PENDING', 'RUNNING', 'RESCALING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
function jobsPage(root) {
  const f = { text: '', state: 'all', tenant: 'all' };
  let last = null;
  const msg = h('div');
  const tenantSel = h('select', { id: 'filter-tenant', onchange: () => { f.tenant = tenantSel.value; draw(); } }, h('option', { value: 'all' }, 'all tenants'));
  const stateSel = h('select', { id: 'filter-state', onchange: () => { f.state = stateSel.value; draw(); } },
    h('option', { value: 'all' }, 'all states'), h('option', { value: 'active' }, 'active'), h('option', { value: 'finished' }, 'finished'), STATES.map((s) => h('option', { value: s }, s)));
  const text = h('input', { id: 'filter-text', type: 'search', placeholder: 'filter by name or id', oninput: () => { f.text = text.value.trim().toLowerCase(); draw(); } });
  const count = h('span', { class: 'sub' });
  const tableBox = h('div', { class: 'scroll' });
  root.append(h('h1', null, 'Jobs ', count), msg, h('div', { class: 'filters' }, text, stateSel, tenantSel), h('div', { class: 'panel' }, tableBox));
  function draw() {
    if (!last) return;
    const tenants = [...new Set(last.jobs.map((j) => j.tenant))].sort();
    if (tenantSel.options.length !== tenants.length + 1) {
      tenantSel.replaceChildren(h('option', { value: 'all' }, 'all tenants'), tenants.map((t) => h('option', { value: t, selected: t === f.tenant }, t)));
    }
    const active = new Set(['PENDING', 'RUNNING', 'RESCALING']);
    const rows = last.jobs.filter((j) => (f.state === 'all' || j.state === f.state || (f.state === 'active' && active.has(j.state)) || (f.state === 'finished' && !active.has(j.state)))
      && (f.tenant === 'all' || j.tenant === f.tenant)
      && (!f.text || j.name.toLowerCase().includes(f.text) || j.id.toLowerCase().includes(f.text))).reverse();
    count.textContent = `${rows.length} of ${last.jobs.length}`;
    const cols = [['job', ''], ['tenant', ''], ['state', ''], ['replicas', 'n'], ['batch', 'n'], ['LR', 'n'], ['goodput (ex/s)', 'n'], ['speedup', 'n'], ['step', 'n'], ['progress', ''], ['ETA', 'n'], ['submitted', 'n'], ['restarts', 'n']];
    tableBox.replaceChildren(rows.length ? h('table', { class: 't', id: 'jobs-table' },
      h('thead', null, h('tr', null, cols.map(([c, k]) => h('th', { class: k }, c)))),
      h('tbody', null, rows.map((j) => h('tr', { 'data-job': j.id, 'data-state': j.state },
        h('td', null, dot(jobColour(j.id)), h('a', { href: '#/jobs/' + encodeURIComponent(j.id) }, j.name), ' ', h('span', { class: 'sub mono' }, j.id)),
        h('td', null, j.tenant), h('td', { class: 'state' }, badge(j.state)),
        h('td', { class: 'n' }, `${j.replicas}`, h('span', { class: 'sub' }, ` / ${j.desired_replicas} (${j.min_replicas}–${j.max_replicas})`)),
        h('td', { class: 'n' }, fmt(j.batch_size)),
        h('td', { class: 'n' }, lrText(j)),
        h('td', { class: 'n' }, fmt(j.goodput)),
        h('td', { class: 'n' }, isNum(j.speedup) ? fmt(j.speedup) + '×' : '—'),
        h('td', { class: 'n' }, fmt(j.step)),
        h('td', null, progressBar(j)),
        h('td', { class: 'n' }, isNum(j.eta_s) ? dur(j.eta_s) : '—'),
        h('td', { class: 'n', title: clock(j.submit_time) }, dur(last.now - j.submit_time) + ' ago'),
        h('td', { class: 'n' }, j.restarts))))) : h('div', { class: 'empty' }, last.jobs.length ? 'no job matches the filters' : 'no jobs yet — submit one with `coadapt submit`'));
  }
  return {
    async refresh() { last = await api('/api/v1/ui/jobs'); msg.replaceChildren(); draw(); },
    fail(e) { errorBox(msg, e); },
  };
}
function lrText(j) {
  if (isNum(j.lr) && isNum(j.lr_scale)) return `${fmt(j.lr * j.lr_scale)} (×${fmt(j.lr_scale)})`;
  if (isNum(j.lr_scale)) return '×' + fmt(j.lr_scale);
  return isNum(j.lr) ? fmt(j.lr) : '—';
}
function progressBar(j) {
  if (!isNum(j.progress)) return h('span', { class: 'sub' }, '—');
  const pct = Math.round(j.progress * 100);
  return h('span', { title: j.total ? `${j.total.value} ${j.total.unit}` : '' }, h('span', { class: 'bar' }, h('span', { style: { width: pct + '%' } })), ` ${pct}%`);
}

// ---------------------------------------------------------------- job page
function jobPage(root, id) {
  const head = h('h1', null, 'Job ', h('span', { class: 'mono' }, id));
  const msg = h('div');
  const cards = h('div', { class: 'cards' });
  const charts = h('div', { class: 'grid2' });
  const modelBox = h('div', { class: 'grid2' });
  const userBox = h('div', { class: 'grid2' });
  const eventsBox = h('div', { class: 'scroll' });
  const info = h('div');
  const logs = logPanel(id);
  root.append(head, msg, cards, charts, h('div', { style: { height: '14px' } }), modelBox, h('div', { style: { height: '14px' } }), userBox,
    h('div', { style: { height: '14px' } }), logs.el, h('div', { class: 'panel' }, h('h2', null, 'Events'), eventsBox), info);
  return {
    async refresh() {
      let d;
      try { d = await api('/api/v1/ui/jobs/' + encodeURIComponent(id)); } catch (e) {
        if (e.status === 404) { this.poll = false; root.replaceChildren(head, h('div', { class: 'error', id: 'not-found' }, `No job ${id} (or it belongs to another tenant).`)); return; }
        throw e;
      }
      const j = d.job, colour = jobColour(j.id), end = j.finished_at || d.now;
      // What an out-of-memory failure taught the job (the controller retries smaller).
      msg.replaceChildren(...(j.memory_limit ? [h('div', { class: 'panel mono', id: 'memory-limit' }, j.memory_limit.text)] : []));
      head.replaceChildren(dot(colour), j.name, ' ', badge(j.state), h('span', { class: 'sub mono' }, j.id), h('span', { class: 'sub' }, `tenant ${j.tenant}`));
      const sp = d.series;
      cards.replaceChildren(
        card('replicas', `${j.replicas} → ${j.desired_replicas}`, ''), card('batch size', fmt(j.batch_size), j.local_bsz ? `m=${j.local_bsz}, s=${j.accum_steps}` : ''),
        card('goodput', fmt(j.goodput), 'ex/s'), card('speedup', isNum(j.speedup) ? fmt(j.speedup) : '—', '×'),
        card('φ (PGNS)', fmt(j.pgns), 'samples'), card('step', fmt(j.step), isNum(j.epoch) ? `epoch ${j.epoch}` : ''),
        card('loss', fmt(j.loss), ''), card('restarts', j.restarts, `${j.failures} failures`),
        card('running for', dur(j.started_at ? end - j.started_at : null), ''));
      const t0 = j.submit_time, t1 = end;
      const line = (title, key, opts = {}) => plot({ title, x: { type: 'time' }, xMin: t0, xMax: t1, y: { label: opts.unit || '' , log: opts.log },
        series: [{ label: title, colour, points: (sp[key] || []).map((p) => [p[0], p[1]]), step: opts.step, dots: (sp[key] || []).length < 40 }], empty: opts.empty || 'not reported yet' });
      charts.replaceChildren(
        h('div', { class: 'panel', id: 'chart-alloc' }, plot({ title: 'Allocation', note: 'replicas held (solid) and the policy\'s choice (dashed)', x: { type: 'time' }, xMin: t0, xMax: t1, y: { label: 'replicas', min: 0 },
          series: [{ label: 'held', colour, points: d.alloc, step: true, width: 2 }, { label: 'desired', colour: '#67717f', points: d.desired, step: true, dash: '4 3' }], empty: 'never allocated' })),
        h('div', { class: 'panel' }, line('Batch size', 'batch_size', { step: true, unit: 'samples' })),
        h('div', { class: 'panel' }, line('Goodput', 'goodput', { unit: 'examples/s' })),
        h('div', { class: 'panel' }, line('φ — gradient noise scale', 'pgns', { unit: 'samples' })),
        h('div', { class: 'panel' }, line('LR scale', 'lr_scale', { unit: '× base LR', empty: 'the job reports no LR scale' })),
        h('div', { class: 'panel' }, line('Loss', 'loss', {})));
      const st = d.step_times;
      const m = d.model;
      modelBox.replaceChildren(
        h('div', { class: 'panel', id: 'chart-steptimes' }, plot({ title: 'Step time: observed vs model', note: m.source ? `θ_sys ${m.source}` : 'no throughput model yet', x: { type: 'time' }, xMin: t0, xMax: t1, y: { label: 's / step', fmt: (v) => fmt(v) },
          series: [{ label: 'observed', colour, points: st.map((p) => [p[0], p[1]]), dots: st.length < 60 }, { label: 'model T_iter', colour: '#1d2430', dash: '5 3', points: st.filter((p) => isNum(p[2])).map((p) => [p[0], p[2]]) }],
          empty: 'no step times yet (needs two progress reports on one allocation)' })),
        h('div', { class: 'panel', id: 'chart-model' }, modelChart(m)),
        ...(typeof ttaPanel === 'function' ? [ttaPanel(d.tta, colour)] : []),
        ...(typeof sparsePanel === 'function' && j.spec && j.spec.sparse ? [sparsePanel(d, colour)] : []));
      const users = Object.entries(d.user_metrics).filter(([n]) => !(typeof sparseOwns === 'function' && sparseOwns(n)));
      userBox.replaceChildren(...users.map(([name, pts], i) => h('div', { class: 'panel' }, plot({ title: name, note: 'reported by the job', x: { type: 'time' }, xMin: t0, xMax: t1, series: [{ label: name, colour: PALETTE[i % PALETTE.length], points: pts.map((p) => [p[0], p[1]]), dots: pts.length < 40 }] }))));
      eventsBox.replaceChildren(h('table', { class: 't', id: 'events-table' }, h('thead', null, h('tr', null, h('th', null, 'time'), h('th', null, 'kind'), h('th', null, 'message'))),
        h('tbody', null, d.events.slice().reverse().map((e) => h('tr', null, h('td', { class: 'mono' }, clock(e.time)), h('td', null, e.kind), h('td', { class: 'msg' }, e.message))))));
      info.replaceChildren(h('div', { class: 'panel' }, h('details', null, h('summary', null, 'spec and replicas'),
        h('pre', { class: 'mono' }, JSON.stringify(j.spec, null, 2)),
        h('table', { class: 't' }, h('thead', null, h('tr', null, ['attempt', 'rank', 'node', 'slot', 'status', 'started', 'ended'].map((c) => h('th', null, c)))),
          h('tbody', null, d.replicas.map((r) => h('tr', null, h('td', null, r.attempt), h('td', null, r.rank), h('td', null, r.node), h('td', null, r.slot), h('td', null, r.status), h('td', null, clock(r.started_at)), h('td', null, clock(r.ended_at)))))))));
      await logs.poll(j);
      if (['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(j.state) && logs.caughtUp()) this.poll = false;
    },
    fail(e) { errorBox(msg, e); },
  };
}
function modelChart(m) {
  const series = [];
  const keyOf = (n, k, s) => `${n}n×${k}r${s ? `, s=${s}` : ''}`;
  const colours = new Map();
  const colourOf = (key) => { if (!colours.has(key)) colours.set(key, PALETTE[colours.size % PALETTE.length]); return colours.get(key); };
  for (const c of m.curves) {
    const key = keyOf(c.nodes, c.replicas, c.accum_steps);
    series.push({ label: `model ${key}`, colour: colourOf(key), points: c.points });
  }
  const groups = new Map();
  for (const p of m.profile) {
    const key = keyOf(p.nodes, p.replicas, p.accum_steps);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push([p.local_bsz, p.iter_time]);
  }
  for (const [key, pts] of groups) series.push({ label: `profiled ${key}`, colour: colourOf(key), points: pts.sort((a, b) => a[0] - b[0]), dots: true, width: 0.01 });
  const perf = m.perf;
  const note = perf ? `α_grad ${fmt(perf.alpha_grad)} s, β_grad ${fmt(perf.beta_grad)} s/sample, γ ${fmt(perf.gamma)}` : '';
  const el = plot({ title: 'Throughput model: T_iter vs per-GPU batch', note, x: { type: 'log', label: 'local batch m (samples per GPU)' }, y: { label: 's / step', fmt: (v) => fmt(v) }, series, legend: true,
    empty: 'the job has reported no throughput model or profile yet' });
  if (m.profile.length === 0 && m.curves.length) el.append(h('div', { class: 'sub' }, 'no profiled step times reported yet: lines are the fitted model only'));
  return el;
}
function logPanel(id) {
  const state = { attempt: null, rank: 0, offset: 0, latest: 0, caught: false, size: 0 };
  const pre = h('pre', { class: 'logs', id: 'logs' });
  const attemptSel = h('select', { id: 'log-attempt', onchange: () => { state.attempt = Number(attemptSel.value); reset(); } });
  const rankSel = h('select', { id: 'log-rank', onchange: () => { state.rank = Number(rankSel.value); reset(); } });
  function reset() { state.offset = 0; state.size = 0; state.caught = false; pre.textContent = ''; }
  const el = h('div', { class: 'panel' }, h('h2', null, 'Logs ', h('span', { class: 'sub' }, 'attempt '), attemptSel, h('span', { class: 'sub' }, ' rank '), rankSel), pre);
  return {
    el,
    caughtUp: () => state.caught,
    async poll(job) {
      if (job.attempt < 1) { pre.textContent = 'not started yet'; return; }
      if (state.latest !== job.attempt) {
        const follow = state.attempt === null || state.attempt === state.latest;
        state.latest = job.attempt;
        attemptSel.replaceChildren(...Array.from({ length: job.attempt }, (_, i) => h('option', { value: i + 1 }, String(i + 1))));
        if (follow) { state.attempt = job.attempt; reset(); }
        attemptSel.value = String(state.attempt);
      }
      const ranks = Math.max(job.spec.max_replicas || 1, job.replicas, 1);
      if (rankSel.options.length !== ranks) {
        rankSel.replaceChildren(...Array.from({ length: ranks }, (_, i) => h('option', { value: i }, String(i))));
        rankSel.value = String(state.rank);
      }
      for (let i = 0; i < 8; i++) {  // catch up at most 8 chunks per refresh
        const c = await api(`/api/v1/jobs/${encodeURIComponent(id)}/logs?attempt=${state.attempt}&rank=${state.rank}&offset=${state.offset}`);
        const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
        if (c.text) {
          pre.append(c.text);
          state.size += c.text.length;
          if (state.size > 400000) { pre.textContent = '… (older output trimmed)\n' + pre.textContent.slice(-300000); state.size = pre.textContent.length; }
          if (stick) pre.scrollTop = pre.scrollHeight;
        }
        state.offset = c.next_offset;
        if (!c.text || c.text.length < 65536) { state.caught = true; break; }
      }
      if (!pre.textContent) pre.textContent = '';
    },
  };
}

// ---------------------------------------------------------------- tuning experiments
function unavailable(root, what) {
  root.append(h('div', { class: 'panel empty', id: 'unavailable' }, `${what} is not available on this controller (it serves no /api/v1/experiments).`));
  return { poll: false, async refresh() { /* nothing to fetch */ } };
}
function experimentsPage(root) {
  root.append(h('h1', null, 'Tuning experiments'));
  if (!S.features || !S.features.experiments) return unavailable(root, 'The tuning service');
  const msg = h('div'), box = h('div', { class: 'panel scroll' });
  root.append(msg, box);
  return {
    async refresh() {
      const d = await api('/api/v1/experiments');
      msg.replaceChildren();
      const xs = d.experiments || [];
      box.replaceChildren(xs.length ? h('table', { class: 't', id: 'experiments-table' },
        h('thead', null, h('tr', null, ['experiment', 'tenant', 'state', 'objective', 'best', 'target', 'trials', 'created'].map((c) => h('th', null, c)))),
        h('tbody', null, xs.map((x) => h('tr', { 'data-experiment': x.id },
          h('td', null, h('a', { href: '#/experiments/' + encodeURIComponent(x.id) }, x.name || x.id)), h('td', null, x.tenant || '—'), h('td', null, badge(x.state || '?')),
          h('td', null, x.objective ? `${x.objective.direction || ''} ${x.objective.metric || ''}` : '—'),
          h('td', { class: 'n' }, fmt(x.best_value, 4)), h('td', { class: 'n' }, fmt(x.target, 4)), h('td', { class: 'n' }, x.n_trials ?? '—'), h('td', null, clock(x.created_at))))))
        : h('div', { class: 'empty' }, 'no experiments yet'));
    },
    fail(e) { errorBox(msg, e); },
  };
}
function experimentPage(root, id) {
  const head = h('h1', null, 'Experiment ', h('span', { class: 'mono' }, id));
  root.append(head);
  if (!S.features || !S.features.experiments) return unavailable(root, 'The tuning service');
  const msg = h('div'), cards = h('div', { class: 'cards' }), charts = h('div', { class: 'grid2' }), table = h('div', { class: 'panel scroll' });
  root.append(msg, cards, charts, h('div', { style: { height: '14px' } }), table);
  return {
    async refresh() {
      let d;
      try { d = await api('/api/v1/experiments/' + encodeURIComponent(id)); } catch (e) {
        if (e.status === 404) { this.poll = false; root.replaceChildren(head, h('div', { class: 'error', id: 'not-found' }, `No experiment ${id} (or it belongs to another tenant).`)); return; }
        throw e;
      }
      msg.replaceChildren();
      const x = d.experiment || {}, trials = d.trials || [], obj = x.objective || {};
      head.replaceChildren(x.name || id, ' ', badge(x.state || '?'), h('span', { class: 'sub mono' }, x.id || id));
      cards.replaceChildren(card('objective', `${obj.direction || ''} ${obj.metric || ''}`, ''), card('best', fmt(x.best_value, 4), ''),
        card('target', fmt(x.target, 4), ''), card('trials', trials.length, ''));
      const curves = trials.filter((t) => (t.curve || []).length).map((t) => ({ label: `trial ${t.number}`, colour: PALETTE[t.number % PALETTE.length], points: t.curve, dots: t.curve.length < 30 }));
      charts.replaceChildren(
        h('div', { class: 'panel', id: 'chart-best' }, plot({ title: 'Best value over time', x: { type: 'time' }, series: [{ label: 'best', colour: '#1f6feb', points: d.best_history || [], step: true, dots: true }], empty: 'no finished trial yet' })),
        h('div', { class: 'panel', id: 'chart-trials' }, plot({ title: `Trial curves (${obj.metric || 'objective'} by step)`, x: { type: 'linear', label: 'step' }, series: curves, legend: curves.length <= 12, empty: 'no trial has reported yet' })));
      const keys = [...new Set(trials.flatMap((t) => Object.keys(t.params || {})))].sort();
      table.replaceChildren(trials.length ? h('table', { class: 't', id: 'trials-table' },
        h('thead', null, h('tr', null, ['#', 'state', ...keys, 'value', 'job'].map((c) => h('th', null, c)))),
        h('tbody', null, trials.map((t) => h('tr', null, h('td', null, dot(PALETTE[t.number % PALETTE.length]), t.number), h('td', null, badge(t.state || '?')),
          keys.map((k) => h('td', { class: 'mono' }, isNum((t.params || {})[k]) ? fmt(t.params[k], 4) : String((t.params || {})[k] ?? '—'))),
          h('td', { class: 'n' }, fmt(t.value, 4)), h('td', null, t.job_id ? h('a', { href: '#/jobs/' + encodeURIComponent(t.job_id) }, t.job_id) : '—')))))
        : h('div', { class: 'empty' }, 'no trials yet'));
    },
    fail(e) { errorBox(msg, e); },
  };
}

// ---------------------------------------------------------------- simulations
const SIMS = [];  // loaded results: {source, summary}, kept across visits to the page
function validSummary(s) {
  return s && typeof s.policy === 'string' && Array.isArray(s.jobs) && Array.isArray(s.utilisation);
}
function simulationsPage(root) {
  const msg = h('div');
  const input = h('input', { type: 'file', id: 'sim-files', accept: '.json,application/json', multiple: true });
  const serverBox = h('span');
  const out = h('div');
  input.addEventListener('change', async () => {
    const errors = [];
    for (const file of input.files) {
      try { addSims(file.name, JSON.parse(await file.text())); } catch (e) { errors.push(`${file.name}: ${e.message}`); }
    }
    input.value = '';
    msg.replaceChildren(...errors.map((e) => h('div', { class: 'error' }, e)));
    draw();
  });
  root.append(h('h1', null, 'Simulations ', h('span', { class: 'sub' }, 'compare policies from `coadapt simulate --json` results (read in this browser, nothing is uploaded)')),
    h('div', { class: 'filters' }, input, serverBox, h('button', { id: 'sim-clear', onclick: () => { SIMS.length = 0; draw(); } }, 'clear')), msg, out);
  function addSims(source, data) {
    const list = Array.isArray(data) ? data : [data];
    if (!list.length || !list.every(validSummary)) throw new Error('not a `coadapt simulate --json` result (expected a list of per-policy summaries)');
    for (const s of list) SIMS.push({ source, s });
  }
  function draw() {
    if (!SIMS.length) { out.replaceChildren(h('div', { class: 'panel empty' }, 'pick one or more JSON files written by `coadapt simulate --json OUT`')); return; }
    const colour = (i) => PALETTE[i % PALETTE.length];
    const label = (r) => SIMS.filter((x) => x.s.policy === r.s.policy).length > 1 ? `${r.s.policy} · ${r.source}` : r.s.policy;
    const hours = (x) => isNum(x) ? fmt(x / 3600, 3) : '—';
    const table = h('table', { class: 't', id: 'sim-table' },
      h('thead', null, h('tr', null, ['policy', 'file', 'workload', 'cluster', 'jobs', 'avg JCT (h)', 'p50 (h)', 'p99 (h)', 'makespan (h)', 'avg queue (h)', 'restarts', 'GPU-h'].map((c, i) => h('th', { class: i > 3 ? 'n' : '' }, c)))),
      h('tbody', null, SIMS.map((r, i) => h('tr', null, h('td', null, dot(colour(i)), r.s.policy), h('td', { class: 'mono' }, r.source), h('td', null, r.s.workload), h('td', null, r.s.cluster),
        h('td', { class: 'n' }, `${r.s.completed}/${r.s.num_jobs}`), h('td', { class: 'n' }, hours(r.s.avg_jct_s)), h('td', { class: 'n' }, hours(r.s.p50_jct_s)), h('td', { class: 'n' }, hours(r.s.p99_jct_s)),
        h('td', { class: 'n' }, hours(r.s.makespan_s)), h('td', { class: 'n' }, hours(r.s.avg_queue_s)), h('td', { class: 'n' }, r.s.restarts), h('td', { class: 'n' }, fmt(r.s.gpu_hours))))));
    const cdf = SIMS.map((r, i) => {
      const j = r.s.jobs.map((x) => x.jct_s).filter(isNum).sort((a, b) => a - b);
      return { label: `${label(r)} (avg ${hours(r.s.avg_jct_s)} h)`, colour: colour(i), step: true, extend: false, points: j.length ? [[j[0] / 3600, 0], ...j.map((v, k) => [v / 3600, (k + 1) / j.length])] : [] };
    });
    const util = SIMS.map((r, i) => ({ label: label(r), colour: colour(i), step: true, extend: false, width: 1.2, points: r.s.utilisation.map((p) => [p[0] / 3600, p[1]]) }));
    out.replaceChildren(h('div', { class: 'panel scroll' }, table), h('div', { class: 'grid2' },
      h('div', { class: 'panel', id: 'chart-cdf' }, plot({ title: 'JCT CDF', x: { type: 'log', label: 'job completion time (hours)' }, y: { label: 'fraction of jobs', min: 0, max: 1 }, series: cdf, legend: true })),
      h('div', { class: 'panel', id: 'chart-util' }, plot({ title: 'GPU utilisation', x: { type: 'linear', label: 'time (hours)' }, y: { label: 'allocated / total', min: 0, max: 1.05, fmt: (v) => fmt(v, 2) }, series: util, legend: true }))));
  }
  draw();
  return {
    poll: false,
    async refresh() {
      if (!S.features || !S.features.simulations_dir) return;
      const d = await api('/api/v1/ui/simulations');
      const sel = h('select', { id: 'sim-server' }, h('option', { value: '' }, `server results (${d.files.length})…`), d.files.map((f) => h('option', { value: f }, f)));
      sel.addEventListener('change', async () => {
        if (!sel.value) return;
        try { addSims(sel.value, await api('/api/v1/ui/simulations/' + encodeURIComponent(sel.value))); msg.replaceChildren(); } catch (e) { errorBox(msg, e); }
        sel.value = '';
        draw();
      });
      serverBox.replaceChildren(sel);
    },
    fail(e) { errorBox(msg, e); },
  };
}

// ---------------------------------------------------------------- start
document.addEventListener('visibilitychange', () => { if (!document.hidden && S.page && S.page.poll !== false) { clearTimeout(S.timer); tick(S.page); } });
window.addEventListener('hashchange', route);
S.token = localStorage.getItem(TOKEN_KEY) || '';
route();
