/* The "Models" view (issue 16): registered models, their versions with state, gate results
 * and lineage, and the promotion history. Reads only the registry's HTTP API
 * (GET /api/v1/models, GET /api/v1/models/{name}?owner=TENANT); uses app.js's h/api/fmt/clock.
 * Loaded after app.js (defer keeps the order): its routes join ROUTES before the first page
 * is chosen, which waits for the whoami request. */
'use strict';
const MODEL_STATE_COLOURS = {
  live: ['#dafbe1', '#1a7f37'], passed: ['#ddf4ff', '#0969da'], failed: ['#ffebe9', '#cf222e'],
  validating: ['#fff1c2', '#9a6700'], registered: ['#e7ebf0', '#39424e'], retired: ['#f0f0f0', '#67717f'],
};
function modelBadge(state) {
  const [bg, fg] = MODEL_STATE_COLOURS[state] || ['#e7ebf0', '#39424e'];
  return h('span', { class: 'badge model-state ' + state, style: { background: bg, color: fg } }, state);
}
function modelHref(m) { return `#/models/${encodeURIComponent(m.tenant)}/${encodeURIComponent(m.name)}`; }
function mb(bytes) { return isNum(bytes) ? fmt(bytes / 1e6, 3) : '—'; }

function modelsPage(root) {
  root.append(h('h1', null, 'Models'));
  const msg = h('div'), box = h('div', { class: 'panel scroll' });
  root.append(msg, box);
  return {
    async refresh() {
      const ms = (await api('/api/v1/models')).models || [];
      msg.replaceChildren();
      box.replaceChildren(ms.length ? h('table', { class: 't', id: 'models-table' },
        h('thead', null, h('tr', null, ['model', 'tenant', 'live', 'newest', 'versions', 'root', 'synced'].map((c) => h('th', null, c)))),
        h('tbody', null, ms.map((m) => h('tr', { 'data-model': m.name },
          h('td', null, h('a', { href: modelHref(m) }, m.name)), h('td', null, m.tenant),
          h('td', { class: 'mono' }, m.live || '—'), h('td', { class: 'mono' }, m.newest || '—'),
          h('td', null, Object.entries(m.states || {}).map(([s, n]) => h('span', null, modelBadge(s), ` ${n} `))),
          h('td', { class: 'mono' }, m.root), h('td', null, isNum(m.synced_at) ? clock(m.synced_at) : '—')))))
        : h('div', { class: 'empty' }, 'no models registered (coadapt model create NAME --root DIR)'));
    },
    fail(e) { errorBox(msg, e); },
  };
}

function checkText(c) {
  const v = isNum(c.value) ? ` ${fmt(c.value, 4)}` : '';
  const b = c.bound ? ` (${c.bound})` : '';
  return `${c.name}: ${c.status}${v}${b}`;
}
function modelPage(root, owner, name) {
  const head = h('h1', null, 'Model ', h('span', { class: 'mono' }, name));
  root.append(head);
  const msg = h('div'), cards = h('div', { class: 'cards' }), versions = h('div', { class: 'panel scroll' }), history = h('div', { class: 'panel scroll' });
  root.append(msg, cards, versions, h('div', { style: { height: '14px' } }), history);
  return {
    async refresh() {
      let d;
      try { d = await api(`/api/v1/models/${encodeURIComponent(name)}?owner=${encodeURIComponent(owner)}`); } catch (e) {
        if (e.status === 404) { this.poll = false; root.replaceChildren(head, h('div', { class: 'error', id: 'not-found' }, `No model ${name} (or it belongs to another tenant).`)); return; }
        throw e;
      }
      msg.replaceChildren();
      const m = d.model, g = m.gates || {};
      const gates = ['integrity', ...(g.metrics || []).map((x) => x.metric), ...(g.drift || []).map((x) => 'drift ' + x.stat)];
      cards.replaceChildren(card('live', m.live || '—', ''), card('rollback to', d.rollback_to || '—', ''),
        card('gates', gates.join(', '), g.auto_promote ? 'auto promote' : ''), card('keep', (m.retention || {}).keep_passed, 'passed versions'));
      const vs = d.versions || [];
      versions.replaceChildren(vs.length ? h('table', { class: 't', id: 'versions-table' },
        h('thead', null, h('tr', null, ['version', 'state', 'kind', 'parent', 'job', 'step', 'data offset', 'MB', 'published', 'gates', 'reason'].map((c) => h('th', null, c)))),
        h('tbody', null, vs.slice().reverse().map((v) => h('tr', { 'data-version': v.version },
          h('td', { class: 'mono' }, v.version), h('td', null, modelBadge(v.state)), h('td', null, v.kind), h('td', { class: 'mono' }, v.parent || '—'),
          h('td', null, v.job_id ? h('a', { href: '#/jobs/' + encodeURIComponent(v.job_id) }, v.job_id) : '—'),
          h('td', { class: 'n' }, v.step ?? '—'), h('td', { class: 'n' }, v.data_offset ?? '—'), h('td', { class: 'n' }, mb(v.size_bytes)),
          h('td', null, isNum(v.created_at) && v.created_at > 0 ? clock(v.created_at) : '—'),
          h('td', { class: 'msg' }, (v.checks || []).map((c) => h('div', { class: 'check ' + c.status, title: c.reason || '' }, checkText(c)))),
          h('td', { class: 'msg' }, v.reason || '')))))
        : h('div', { class: 'empty' }, 'no complete version yet'));
      const ps = d.promotions || [];
      history.replaceChildren(h('h3', null, 'Promotions'), ps.length ? h('table', { class: 't', id: 'promotions-table' },
        h('thead', null, h('tr', null, ['when', 'action', 'from', 'to', 'who'].map((c) => h('th', null, c)))),
        h('tbody', null, ps.slice().reverse().map((p) => h('tr', null, h('td', null, clock(p.at)), h('td', null, p.action),
          h('td', { class: 'mono' }, p.from_version || '—'), h('td', { class: 'mono' }, p.to_version), h('td', null, p.who)))))
        : h('div', { class: 'empty' }, 'never promoted'));
    },
    fail(e) { errorBox(msg, e); },
  };
}

ROUTES.push(
  [/^#\/models$/, 'models', (r) => modelsPage(r)],
  [/^#\/models\/([^/?#]+)\/([^/?#]+)$/, 'models', (r, m) => modelPage(r, decodeURIComponent(m[1]), decodeURIComponent(m[2]))],
);
