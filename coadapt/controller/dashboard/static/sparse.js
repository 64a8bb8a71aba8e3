/* The job page's panel for sparse (parameter-server) jobs: throughput, rows per shard server and
 * gradient push bytes, read from the metrics the lead worker reports (coadapt.sparse.online:
 * samples_per_s, window_auc, sparse/rows, sparse/rows/shard<i>, sparse/pushed_bytes) in
 * GET /api/v1/ui/jobs/{id} -> job.metrics (latest values) and user_metrics (series).
 * Uses app.js's h/plot/fmt/card/isNum/PALETTE. */
'use strict';
const SPARSE_SHARD = /^sparse\/rows\/shard(\d+)$/;
// The per-shard row series are drawn here, together, not as one plot each below.
function sparseOwns(name) { return SPARSE_SHARD.test(name); }
function sparseBytes(b) {
  if (!isNum(b)) return '—';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (b >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return `${fmt(b, 3)} ${units[i]}`;
}
function sparsePanel(d, colour) {
  const j = d.job, m = j.metrics || {}, um = d.user_metrics || {};
  const sec = (j.spec && j.spec.sparse) || {};
  const panel = h('div', { class: 'panel', id: 'sparse-panel' }, h('h2', null, 'Sparse training'));
  const shards = Object.keys(m).map((k) => SPARSE_SHARD.exec(k)).filter(Boolean)
    .map((r) => [Number(r[1]), m[r[0]]]).sort((a, b) => a[0] - b[0]);
  panel.append(h('div', { class: 'cards' },
    card('samples/s', fmt(m.samples_per_s), 'lead worker'),
    card('window AUC', isNum(m.window_auc) ? fmt(m.window_auc, 4) : '—', 'progressive validation'),
    card('rows', fmt(m['sparse/rows']), `${shards.length || sec.servers || '?'} shard server(s)`),
    card('pushed', sparseBytes(m['sparse/pushed_bytes']), 'gradient pushes, since the worker started')));
  const total = shards.reduce((s, p) => s + (isNum(p[1]) ? p[1] : 0), 0);
  panel.append(h('table', { class: 't', id: 'sparse-shards' },
    h('thead', null, h('tr', null, h('th', null, 'shard'), h('th', null, 'rows'), h('th', null, 'share'))),
    h('tbody', null, shards.length ? shards.map(([i, v]) => h('tr', { 'data-shard': i },
      h('td', null, i), h('td', { class: 'mono' }, fmt(v)), h('td', null, total ? `${Math.round((100 * v) / total)} %` : '—')))
      : [h('tr', null, h('td', { colspan: 3, class: 'sub' }, 'no shard report yet'))])));
  const t0 = j.submit_time, t1 = j.finished_at || d.now;
  const pts = (k) => (um[k] || []).map((p) => [p[0], p[1]]);
  panel.append(h('div', { class: 'grid2' },
    plot({ title: 'Rows per shard', x: { type: 'time' }, xMin: t0, xMax: t1, y: { label: 'rows', min: 0 }, legend: true,
      series: shards.map(([i], n) => ({ label: `shard ${i}`, colour: PALETTE[n % PALETTE.length], points: pts(`sparse/rows/shard${i}`), step: true })),
      empty: 'no shard report yet' }),
    plot({ title: 'Throughput', x: { type: 'time' }, xMin: t0, xMax: t1, y: { label: 'samples/s', min: 0 },
      series: [{ label: 'samples/s', colour, points: pts('samples_per_s') }], empty: 'not reported yet' })));
  return panel;
}
