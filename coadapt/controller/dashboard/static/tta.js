/* The job page's "did co-adaptation pay?" panel (issue 19): the job's training time so far vs
 * what the user's initial batch, fixed, would have needed for the same progress, both read off
 * the job's fitted goodput model (GET /api/v1/ui/jobs/{id} -> tta). Uses app.js's h/plot/fmt. */
'use strict';
function ttaPanel(t, colour) {
  const secs = (s) => (isNum(s) && s < 60 ? `${fmt(s, 3)} s` : dur(s));
  const panel = h('div', { class: 'panel', id: 'chart-tta' });
  if (!t || !t.points || !t.points.length) {
    panel.append(plot({ title: 'Time so far vs the initial batch', series: [], empty: 'needs a throughput model and two progress reports on one allocation' }));
    return panel;
  }
  const ratio = isNum(t.speedup) ? t.speedup : null;
  const verdict = ratio === null ? '' : ratio >= 1 ? `${fmt(ratio, 2)}× faster than batch ${t.init_batch} fixed` : `${fmt(1 / ratio, 2)}× slower than batch ${t.init_batch} fixed`;
  panel.append(plot({
    title: 'Time so far vs the initial batch', note: verdict,
    x: { type: 'time' }, y: { label: 'training seconds', fmt: (v) => fmt(v) }, legend: true,
    series: [
      { label: 'this job (model)', colour, points: t.points.map((p) => [p[0], p[1]]), width: 2 },
      { label: `batch ${t.init_batch} fixed (model)`, colour: '#1d2430', dash: '5 3', points: t.points.map((p) => [p[0], p[2]]) },
      { label: 'this job (wall clock)', colour: '#67717f', dash: '2 3', points: t.points.map((p) => [p[0], p[3]]) },
    ],
  }));
  panel.append(h('div', { class: 'sub', id: 'tta-summary' },
    `same progress (${fmt(t.equivalent_samples)} samples at batch ${t.init_batch}): this job ${secs(t.adaptive_model_s)} by the model (${secs(t.elapsed_s)} wall clock), batch ${t.init_batch} fixed ${secs(t.fixed_model_s)}`));
  return panel;
}
