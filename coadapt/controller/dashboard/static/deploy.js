/* Deployments (issue 17): serving replicas on the cluster page's slot map, coloured by
 * deployment, a Deployments panel beside the active jobs, and the #/deployments page. Reads
 * GET /api/v1/ui/serving (your deployments as GET /api/v1/deployments gives them, and every
 * slot a serving replica holds, other tenants' anonymised). Uses app.js's h/api/fmt/clock;
 * loaded after it (defer keeps the order). */
'use strict';
const deployColour = (name) => `hsl(${hashHue('deploy:' + name)},70%,38%)`;
const DEPLOY_STATE_COLOURS = { active: ['#dafbe1', '#1a7f37'], deleting: ['#fff1c2', '#9a6700'], deleted: ['#f0f0f0', '#67717f'] };
function deployBadge(state) {
  const [bg, fg] = DEPLOY_STATE_COLOURS[state] || ['#e7ebf0', '#39424e'];
  return h('span', { class: 'badge deploy-state ' + state, style: { background: bg, color: fg } }, state);
}
const msText = (s) => (isNum(s) ? fmt(s * 1000, 3) : '—');

/** The serving half of the cluster: null when the controller has no deployment routes. */
async function servingData() {
  try { return await api('/api/v1/ui/serving'); } catch (e) {
    if (e.status === 404) return null;
    throw e;
  }
}

/** Serving replicas as slot-map entries (app.js's nodeCard draws them). */
function servingSlots(sv) {
  return (sv ? sv.replicas : []).map((r) => ({ ...r, serving: true }));
}

/** One slot held by a serving replica: coloured by deployment, or anonymised. */
function servingSlotCard(i, r) {
  if (r.other) {
    return h('div', { class: 'slot other serving ' + r.status, 'data-slot': i, title: "another tenant's serving replica" },
      h('span', { class: 'idx' }, '#' + i + ' · serving'), h('span', { class: 'nm' }, 'other tenant'));
  }
  return h('a', { class: 'slot serving ' + r.status, 'data-slot': i, 'data-deployment': r.deployment, href: '#/deployments',
    style: { background: deployColour(r.deployment) }, title: `deployment ${r.deployment}, ${r.status}` },
  h('span', { class: 'idx' }, `#${i} · serving`), h('span', { class: 'nm' }, r.deployment), h('span', { class: 'idx' }, r.status));
}

function p99Cell(d) {
  const p = d.live && d.live.latency_q_s;
  const over = isNum(p) && p > d.slo_s;
  return h('td', { class: 'n' + (over ? ' over-slo' : ''), title: over ? 'above the SLO' : '' }, `${msText(p)} / ${msText(d.slo_s)}`);
}

/** The Deployments table: replicas ready/desired, load, p99 vs SLO, shed, errors. */
function deploymentsTable(ds) {
  if (!ds.length) return h('div', { class: 'empty' }, 'no deployments (coadapt deploy SPEC.yaml)');
  return h('table', { class: 't', id: 'deployments-table' },
    h('thead', null, h('tr', null, ['deployment', 'tenant', 'model', 'state', 'ready / desired', 'starting', 'req/s', 'p99 / SLO ms', 'shed', 'errors', 'url']
      .map((c, i) => h('th', { class: i > 3 && i < 10 ? 'n' : '' }, c)))),
    h('tbody', null, ds.map((d) => {
      const r = d.replicas, live = d.live || {};
      const desired = isNum(r.desired) ? r.desired : '—';
      return h('tr', { 'data-deployment': d.name },
        h('td', null, dot(deployColour(d.name)), d.name), h('td', null, d.tenant),
        h('td', { class: 'mono' }, `${d.model}@${d.version}`), h('td', null, deployBadge(d.state)),
        h('td', { class: 'n ready' }, `${r.ready} / ${desired}`), h('td', { class: 'n' }, r.starting),
        h('td', { class: 'n rps' }, isNum(live.requests_per_s) ? fmt(live.requests_per_s, 3) : '—'), p99Cell(d),
        h('td', { class: 'n' }, live.shed_total ?? '—'), h('td', { class: 'n' }, live.errors_total ?? '—'),
        h('td', { class: 'mono' }, d.url));
    })));
}

function deploymentsPage(root) {
  root.append(h('h1', null, 'Deployments'));
  const msg = h('div'), cards = h('div', { class: 'cards' }), box = h('div', { class: 'panel scroll' });
  root.append(msg, cards, box);
  return {
    async refresh() {
      const sv = await servingData();
      msg.replaceChildren();
      if (!sv) { box.replaceChildren(h('div', { class: 'empty' }, 'this controller serves no deployments')); return; }
      const ds = sv.deployments;
      const sum = (f) => ds.reduce((a, d) => a + (f(d) || 0), 0);
      cards.replaceChildren(card('deployments', ds.length, ''),
        card('ready replicas', sum((d) => d.replicas.ready), ''),
        card('load', fmt(sum((d) => d.live && d.live.requests_per_s), 3), 'req/s'),
        card('over SLO', ds.filter((d) => d.live && isNum(d.live.latency_q_s) && d.live.latency_q_s > d.slo_s).length, 'deployments'));
      box.replaceChildren(deploymentsTable(ds));
    },
    fail(e) { errorBox(msg, e); },
  };
}

ROUTES.push([/^#\/deployments$/, 'deployments', (r) => deploymentsPage(r)]);
