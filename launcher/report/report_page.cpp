// The report's page: styles and script inline, the run's files inlined as JSON strings, every
// chart an SVG the script draws (no library, no network). A script error is shown on the page
// (class "script-error"), where a test in a browser looks for it.
#include "launcher/report/html_report.h"

#include <cstdio>
#include <string>

namespace ht {
namespace {

// `text` as a JSON string literal safe inside <script>: quotes, backslashes, control characters
// and <, >, & escaped.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  out.reserve(text.size() + text.size() / 8 + 2);
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

const char* kStyle = R"CSS(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #1d2330; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #dde; }
.sub { color: #667; } .grid { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; }
.grid > * { min-width: 0; }
.card { border: 1px solid #dde3ee; border-radius: 6px; padding: 10px 12px; background: #fbfcfe; }
svg.chart { width: 100%; height: auto; display: block; } svg.chart text { font-size: 11px; fill: #445; }
.legend span { margin-right: 12px; white-space: nowrap; } .legend i { display: inline-block; width: 14px; height: 3px; margin-right: 4px; vertical-align: middle; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 3px 10px; border-bottom: 1px solid #e4e8f0; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f4f6fa; padding: 10px; overflow: auto; max-height: 420px; font-size: 12px; }
.note { color: #8a5a00; } .script-error { color: #b00020; font-weight: bold; }
)CSS";

// Charts: line(), bars() (stacked, per step) and timeline() each return an SVG element.
const char* kScript = R"JS(
'use strict';
window.reportErrors = [];
function showError(message) {
  window.reportErrors.push(message);
  const div = document.createElement('div');
  div.className = 'script-error';
  div.textContent = 'report script error: ' + message;
  document.body.prepend(div);
}
window.addEventListener('error', e => showError(e.message));
const SVG = 'http://www.w3.org/2000/svg';
const COLORS = ['#2f6fdf', '#e0782b', '#2a9d5b', '#c23b6e', '#7b5cd6', '#888f9c', '#c9a227'];
function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(v) {
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 0 : 1) + 'G';
  if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + 'M';
  if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + 'k';
  return a >= 10 || a === 0 ? v.toFixed(0) : v.toPrecision(2);
}
function ticks(lo, hi, n) {
  const span = hi - lo || 1, step = Math.pow(10, Math.floor(Math.log10(span / n)));
  const nice = [1, 2, 5, 10].map(m => m * step).find(s => span / s <= n) || step * 10;
  const out = [];
  for (let t = Math.ceil(lo / nice) * nice; t <= hi + 1e-9 * span; t += nice) out.push(t);
  return out;
}
// A frame with axes for x in [x0, x1], y in [y0, y1]; returns the svg and the scales.
function frame(title, x0, x1, y0, y1, xlabel, ylabel) {
  const W = 520, H = 260, L = 56, R = 12, T = 22, B = 36;
  const svg = el('svg', {viewBox: `0 0 ${W} ${H}`, class: 'chart', 'data-title': title});
  const sx = x => L + (x - x0) / ((x1 - x0) || 1) * (W - L - R);
  const sy = y => H - B - (y - y0) / ((y1 - y0) || 1) * (H - T - B);
  el('text', {x: L, y: 14, 'font-weight': 'bold'}, svg).textContent = title;
  for (const t of ticks(y0, y1, 5)) {
    el('line', {x1: L, x2: W - R, y1: sy(t), y2: sy(t), stroke: '#e6e9f0'}, svg);
    el('text', {x: L - 6, y: sy(t) + 4, 'text-anchor': 'end'}, svg).textContent = fmt(t);
  }
  for (const t of ticks(x0, x1, 8)) {
    el('text', {x: sx(t), y: H - B + 14, 'text-anchor': 'middle'}, svg).textContent = fmt(t);
  }
  el('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#889'}, svg);
  el('line', {x1: L, x2: L, y1: T, y2: H - B, stroke: '#889'}, svg);
  el('text', {x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle'}, svg).textContent = xlabel;
  const yl = el('text', {x: 12, y: (T + H - B) / 2, 'text-anchor': 'middle', transform: `rotate(-90 12 ${(T + H - B) / 2})`}, svg);
  yl.textContent = ylabel;
  return {svg, sx, sy};
}
function legend(series) {
  const div = document.createElement('div');
  div.className = 'legend';
  series.forEach((s, i) => {
    const span = document.createElement('span');
    span.innerHTML = `<i style="background:${s.color || COLORS[i % COLORS.length]}"></i>`;
    span.appendChild(document.createTextNode(s.name));
    div.appendChild(span);
  });
  return div;
}
// series: [{name, points: [[x, y], ...], color, dash}]
function line(title, xlabel, ylabel, series, opts) {
  series = series.filter(s => s.points.length > 0);
  const card = document.createElement('div');
  card.className = 'card';
  if (series.length === 0) { card.textContent = title + ': no data in this run'; return card; }
  const xs = series.flatMap(s => s.points.map(p => p[0])), ys = series.flatMap(s => s.points.map(p => p[1]));
  const y0 = opts && opts.zero === false ? Math.min(...ys) : Math.min(0, ...ys);
  const f = frame(title, Math.min(...xs), Math.max(...xs), y0, Math.max(...ys) * 1.05 || 1, xlabel, ylabel);
  series.forEach((s, i) => {
    const color = s.color || COLORS[i % COLORS.length];
    const pts = s.points.map(p => `${f.sx(p[0]).toFixed(1)},${f.sy(p[1]).toFixed(1)}`).join(' ');
    el('polyline', {points: pts, fill: 'none', stroke: color, 'stroke-width': 1.6, 'stroke-dasharray': s.dash || '',
                    class: 'series', 'data-name': s.name}, f.svg);
    if (s.points.length < 40) for (const p of s.points) el('circle', {cx: f.sx(p[0]), cy: f.sy(p[1]), r: 2.2, fill: color}, f.svg);
  });
  card.appendChild(f.svg);
  card.appendChild(legend(series));
  return card;
}
// Stacked bars per step: parts [{name, values: [...]}] over steps [...].
function bars(title, steps, parts, xlabel, ylabel) {
  const card = document.createElement('div');
  card.className = 'card';
  if (steps.length === 0) { card.textContent = title + ': no data in this run'; return card; }
  const totals = steps.map((_, i) => parts.reduce((a, p) => a + Math.max(0, p.values[i] || 0), 0));
  // Logged steps may be every log_interval-th: bars as wide as the mean gap between them.
  const gap = steps.length > 1 ? (steps[steps.length - 1] - steps[0]) / (steps.length - 1) : 1;
  const f = frame(title, steps[0] - gap / 2, steps[steps.length - 1] + gap / 2, 0, Math.max(...totals) * 1.05 || 1,
                  xlabel || 'step', ylabel || 'ms');
  const w = Math.max(1, (f.sx(steps[0] + gap) - f.sx(steps[0])) * 0.8);
  steps.forEach((s, i) => {
    let base = 0;
    parts.forEach((p, k) => {
      const v = Math.max(0, p.values[i] || 0);
      if (v > 0) el('rect', {x: f.sx(s) - w / 2, width: w, y: f.sy(base + v), height: f.sy(base) - f.sy(base + v),
                             fill: COLORS[k % COLORS.length], class: 'series', 'data-name': p.name}, f.svg);
      base += v;
    });
  });
  card.appendChild(f.svg);
  card.appendChild(legend(parts));
  return card;
}
function median(values) {
  const v = values.filter(x => Number.isFinite(x)).sort((a, b) => a - b);
  return v.length ? v[Math.floor(v.length / 2)] : NaN;
}
function table(rows) {
  const t = document.createElement('table');
  for (const r of rows) {
    const tr = document.createElement('tr');
    r.forEach((cell, i) => {
      const td = document.createElement(i === 0 ? 'th' : 'td');
      td.textContent = cell;
      if (i > 0 && /^[-0-9.,]+( [a-zA-Z%]+)?x?$/.test(cell)) td.className = 'num';
      tr.appendChild(td);
    });
    t.appendChild(tr);
  }
  return t;
}
function section(title, ...children) {
  const s = document.createElement('section');
  const h = document.createElement('h2');
  h.textContent = title;
  s.appendChild(h);
  const grid = document.createElement('div');
  grid.className = 'grid';
  children.forEach(c => grid.appendChild(c));
  s.appendChild(grid);
  document.getElementById('report').appendChild(s);
}
function guarded(what, draw) { try { draw(); } catch (e) { showError(what + ': ' + e.message); } }

const D = JSON.parse(document.getElementById('run-data').textContent);
const records = D.metrics.split('\n').filter(l => l.trim()).map(l => JSON.parse(l));
const train = records.filter(r => r.event === 'train'), evals = records.filter(r => r.event === 'eval');
const summary = D.summary ? JSON.parse(D.summary) : {};
const pts = (rows, key, scale) => rows.filter(r => r[key] != null).map(r => [r.step, r[key] * (scale || 1)]);
const MB = 1 / 1048576;

guarded('headline', () => {
  const last = train[train.length - 1] || {};
  const e = evals[evals.length - 1] || {};
  const words = [`${summary.steps ?? last.step ?? 0} steps`, `final loss ${(summary.final_loss ?? last.loss ?? NaN).toFixed(4)}`];
  if (e.eval_accuracy != null) words.push(`eval accuracy ${e.eval_accuracy.toFixed(4)}`);
  if (summary.stopped_by) words.push(`stopped by ${summary.stopped_by}`);
  document.getElementById('headline').textContent = words.join(' \u00b7 ');
});
guarded('loss', () => {
  section('Loss and evaluation',
    line('Loss', 'step', 'loss', [{name: 'train loss', points: pts(train, 'loss')},
                                  {name: 'eval loss', points: pts(evals, 'eval_loss'), dash: '5 3'}], {zero: false}),
    line('Evaluation', 'step', '', [{name: 'accuracy', points: pts(evals, 'eval_accuracy')},
                                    {name: 'perplexity', points: pts(evals, 'eval_perplexity')},
                                    {name: 'learning rate x 10', points: pts(train, 'lr', 10), dash: '2 3'}]));
});
guarded('time', () => {
  const steps = train.map(r => r.step);
  const v = key => train.map(r => r[key] || 0);
  const recompute = v('recompute_ms'), swap = train.map(r => (r.swap_wait_ms || 0) + (r.state_wait_ms || 0));
  const comm = v('comm_ms').map(x => Math.max(0, x)), optimizer = v('optimizer_ms');  // -1: not measured
  const fb = train.map((r, i) => r.forward_backward_ms != null ? Math.max(0, r.forward_backward_ms - recompute[i] - swap[i]) : 0);
  const other = train.map((r, i) => Math.max(0, r.step_ms - fb[i] - recompute[i] - swap[i] - comm[i] - optimizer[i]));
  section('Step time',
    bars('Where each step went', steps, [{name: 'compute', values: fb}, {name: 'recomputation', values: recompute},
                                          {name: 'swap waits', values: swap}, {name: 'all-reduce', values: comm},
                                          {name: 'optimizer', values: optimizer}, {name: 'other (data, waits)', values: other}]),
    line('Step time', 'step', 'ms', [{name: 'measured', points: pts(train, 'step_ms')},
                                     {name: 'predicted', points: pts(train, 'predicted_step_ms'), dash: '5 3'}]));
});
guarded('memory', () => {
  section('Memory per step',
    line('Device memory', 'step', 'MiB', [{name: 'peak', points: pts(train, 'mem_peak_bytes', MB)},
                                          {name: 'budget', points: pts(train, 'mem_budget_bytes', MB), dash: '6 3'},
                                          {name: 'activations held (peak)', points: pts(train, 'activation_peak_bytes', MB)},
                                          {name: 'predicted peak', points: pts(train, 'predicted_peak_bytes', MB), dash: '2 3'}]),
    line('Moved and regenerated', 'step', 'MiB / count', [{name: 'swapped out, MiB', points: pts(train, 'swap_out_bytes', MB)},
                                                          {name: 'swapped in, MiB', points: pts(train, 'swap_in_bytes', MB)},
                                                          {name: 'evictions', points: pts(train, 'evictions')},
                                                          {name: 'recomputations', points: pts(train, 'recomputations')}]));
});
guarded('trace', () => {
  if (D.trace_note) { section('Memory trace', Object.assign(document.createElement('p'), {className: 'note', textContent: D.trace_note})); return; }
  if (!D.trace) return;
  const t = JSON.parse(D.trace);
  const events = Array.isArray(t) ? t : (t.traceEvents || []);
  const t0 = Math.min(...events.map(e => e.ts).filter(Number.isFinite));
  const ms = e => (e.ts - t0) / 1e3;
  const inUse = events.filter(e => e.ph === 'C' && e.args && e.args.in_use != null).map(e => [ms(e), e.args.in_use * MB]);
  const stride = Math.max(1, Math.floor(inUse.length / 4000));
  const card = line('Bytes in use over the traced steps', 'ms', 'MiB', [{name: 'in use', points: inUse.filter((_, i) => i % stride === 0)}]);
  const svg = card.querySelector('svg');
  if (svg) {
    const xs = inUse.map(p => p[0]), x0 = Math.min(...xs), x1 = Math.max(...xs);
    const sx = x => 56 + (x - x0) / ((x1 - x0) || 1) * (520 - 68);
    const mark = (filter, color, row, name) => {
      for (const e of events.filter(filter)) el('rect', {x: sx(ms(e)), y: 200 + row * 7, width: Math.max(1, (e.dur || 0) / 1e3 / ((x1 - x0) || 1) * 452), height: 5, fill: color, class: 'mark', 'data-name': name}, svg);
    };
    mark(e => e.cat === 'evict', '#c23b6e', 0, 'eviction');
    mark(e => e.cat === 'recompute', '#e0782b', 1, 'recomputation');
    mark(e => e.cat === 'swap_out' || e.cat === 'swap_in', '#2a9d5b', 2, 'swap');
    mark(e => e.cat === 'swap_wait', '#7b5cd6', 3, 'swap wait');
    card.appendChild(legend([{name: 'evictions', color: '#c23b6e'}, {name: 'recomputations', color: '#e0782b'},
                             {name: 'copies to and from host', color: '#2a9d5b'}, {name: 'waits for a copy', color: '#7b5cd6'}]));
  }
  section('Memory trace', card);
});
guarded('replicas', () => {
  const ranked = train.filter(r => Array.isArray(r.rank_step_ms));
  if (ranked.length === 0) return;
  const ranks = ranked[0].rank_step_ms.length, ids = Array.from({length: ranks}, (_, k) => k);
  const per = key => ids.map(k => median(ranked.map(r => r[key][k])));
  const step = per('rank_step_ms'), compute = per('rank_compute_ms'), wait = per('rank_wait_ms'), opt = per('rank_optimizer_ms');
  section('Per data-parallel rank (median over logged steps)',
    bars('Where each rank\'s step went (a slow rank shows as the others\' waiting)', ids,
         [{name: 'forward and backward', values: compute}, {name: 'waiting for the all-reduce', values: wait},
          {name: 'optimizer', values: opt}, {name: 'other', values: ids.map(k => Math.max(0, step[k] - compute[k] - wait[k] - opt[k]))}], 'rank'),
    bars('Memory peak per rank', ids, [{name: 'peak', values: per('rank_peak_bytes').map(v => v * MB)}], 'rank', 'MiB'));
});
guarded('ranks', () => {
  const staged = train.filter(r => Array.isArray(r.stage_compute_ms));
  if (staged.length === 0) return;
  const stages = staged[0].stage_compute_ms.length;
  const per = key => Array.from({length: stages}, (_, s) => median(staged.map(r => r[key][s])));
  section('Per pipeline stage (median over steps)', bars('Compute and waiting per stage', Array.from({length: stages}, (_, s) => s),
          [{name: 'compute', values: per('stage_compute_ms')}, {name: 'waiting (bubble, messages)', values: per('stage_wait_ms')}], 'stage'));
});
guarded('predictions', () => {
  const steady = train.slice(Math.min(3, Math.max(0, train.length - 1)));
  const rows = [['', 'predicted', 'measured']];
  const mib = v => v == null || !Number.isFinite(v) ? '-' : (v * MB).toFixed(1) + ' MiB';
  const msf = v => v == null || !Number.isFinite(v) ? '-' : v.toFixed(1) + ' ms';
  // Both sides count the same bytes: the rank's device memory (its arena, or what it would hold),
  // never host data such as the data set.
  rows.push(['peak device memory per rank: parameters, gradients, optimizer state, batch, activations (not host data)',
             mib(summary.predicted_peak_bytes), mib(Math.max(...train.map(r => r.mem_peak_bytes || 0)))]);
  rows.push(['step time (median after 3 steps)', msf(summary.predicted_step_ms), msf(median(steady.map(r => r.step_ms)))]);
  if (summary.predicted_swap_out_bytes != null) rows.push(['swapped out per step', mib(summary.predicted_swap_out_bytes), mib(median(steady.map(r => r.swap_out_bytes)))]);
  const info = [['job', summary.job || ''], ['model', `${summary.model || ''} (${summary.parameters ?? '?'} parameters)`],
                ['device', summary.device || ''], ['samples per second', summary.samples_per_s != null ? summary.samples_per_s.toFixed(1) : '-'],
                ['wall time', summary.wall_s != null ? summary.wall_s.toFixed(1) + ' s' : '-']];
  const pre = document.createElement('pre');
  pre.textContent = D.config || '(no config.resolved.toml)';
  const left = document.createElement('div');
  left.className = 'card';
  left.appendChild(table(rows));
  left.appendChild(document.createElement('br'));
  left.appendChild(table(info));
  const right = document.createElement('div');
  right.className = 'card';
  right.appendChild(pre);
  section('The planner\'s prediction and the run', left, right);
});
document.body.setAttribute('data-rendered', String(window.reportErrors.length === 0));
)JS";

}  // namespace

std::string report_page(const std::string& title, const std::string& metrics_jsonl, const std::string& summary_json,
                        const std::string& config_toml, const std::string& trace_json, const std::string& trace_note) {
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>hybrid_train report: " +
                     html_escape(title) + "</title>\n<style>" + kStyle + "</style></head>\n<body>\n<h1>hybrid_train: " +
                     html_escape(title) + "</h1><div class=\"sub\" id=\"headline\"></div>\n<div id=\"report\"></div>\n";
  page += "<script type=\"application/json\" id=\"run-data\">{\"metrics\": " + json_string(metrics_jsonl) +
          ", \"summary\": " + json_string(summary_json) + ", \"config\": " + json_string(config_toml) +
          ", \"trace\": " + json_string(trace_json) + ", \"trace_note\": " + json_string(trace_note) + "}</script>\n";
  page += std::string("<script>") + kScript + "</script>\n</body></html>\n";
  return page;
}

}  // namespace ht
