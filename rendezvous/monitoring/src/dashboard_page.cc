// The dashboard: one self-contained page (HTML, CSS, JS; charts in SVG),
// nothing from the internet. It polls /api/v1/jobs and /api/v1/jobs/<job>
// every second and redraws. docs/monitoring.md shows it.
#include "ddprun/rendezvous/monitoring/monitoring_routes.h"

namespace ddprun::rendezvous {

const char kDashboardHtml[] = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ddprun dashboard</title>
<style>
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header h1{font-size:16px;margin:0}
select{font:inherit}
main{padding:12px 16px}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:10px}
.chip{background:#fff;border:1px solid #d6dae1;border-radius:6px;padding:4px 10px}
.chip b{display:block;font-size:15px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{background:#fff;border:1px solid #d6dae1;border-radius:6px;padding:6px;flex:1 1 420px}
.chart h3{margin:0 0 4px;font-size:13px}
svg{width:100%;height:160px;display:block}
table{border-collapse:collapse;background:#fff;margin-top:12px;width:100%}
th,td{border:1px solid #e1e4ea;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#eef0f4;position:sticky;top:0}
td.l,th.l{text-align:left}
tr.straggler td{background:#fff3c4}
tr.culprit td{background:#ffd9d6}
tr.notrunning td{color:#888}
pre{white-space:pre-wrap;border-radius:6px;padding:8px;margin:10px 0}
pre.hang{background:#ffe9e7;border:1px solid #e0796d}
pre.failure{background:#fff3e0;border:1px solid #e0a96d}
#events{background:#fff;border:1px solid #d6dae1;border-radius:6px;padding:6px;margin-top:12px;max-height:220px;overflow:auto}
#events div{border-bottom:1px solid #f0f1f4;padding:2px 0}
.k{display:inline-block;min-width:62px;font-weight:600}
#err{color:#b3261e}
.muted{color:#6b7280}
</style></head><body>
<header><h1>ddprun</h1><label>job <select id="job"></select></label>
<span id="updated" class="muted"></span><span id="err"></span></header>
<main>
<div class="chips" id="chips"></div>
<pre class="hang" id="hang" hidden></pre>
<pre class="failure" id="failure" hidden></pre>
<div class="charts">
<div class="chart"><h3>samples/s (job)</h3><svg id="c_samples" viewBox="0 0 600 160" preserveAspectRatio="none"></svg></div>
<div class="chart"><h3>step time, s (slowest rank's median)</h3><svg id="c_step" viewBox="0 0 600 160" preserveAspectRatio="none"></svg></div>
</div>
<div id="ranknote" class="muted"></div>
<table id="ranks"><thead><tr>
<th>rank</th><th class="l">host</th><th>pid</th><th class="l">state</th><th>steps</th>
<th>p50 s</th><th>p90 s</th><th>steps/s</th><th>samples/s</th><th>CPU %</th><th>RSS MiB</th>
<th>GPU %</th><th>GPU MiB</th><th>comm %</th><th title="newest step in checkpoint memory">ckpt step</th><th>ckpt MiB</th><th title="checkpoint memory held">ckpt mem MiB</th><th>straggler</th><th>age s</th><th class="l">scalars</th>
</tr></thead><tbody></tbody></table>
<div id="events"></div>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const MAX_ROWS = 256;
let current = new URLSearchParams(location.search).get("job") || decodeURIComponent(location.hash.slice(1));
function fmt(v, d) { return v === null || v === undefined ? "n/a" : Number(v).toFixed(d); }
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c])); }
function chip(label, value, id) { return `<div class="chip" id="chip_${id}">${esc(label)}<b>${esc(value)}</b></div>`; }
function chart(svg, series, col, events, t0, t1) {
  const W = 600, H = 160, P = 4;
  const pts = series.filter(p => p[col] !== null);
  let max = 0; for (const p of pts) max = Math.max(max, p[col]);
  if (max <= 0) max = 1;
  const span = Math.max(t1 - t0, 1);
  const x = t => P + (W - 2 * P) * (t - t0) / span, y = v => H - P - (H - 2 * P) * v / (max * 1.1);
  let out = "";
  for (const e of events) {
    if (e.unix_s < t0 || !["round","restart","lost","hang","closed","failure"].includes(e.kind)) continue;
    const c = e.kind === "round" ? "#2e7d32" : e.kind === "hang" || e.kind === "failure" ? "#c62828" : "#ef6c00";
    out += `<line x1="${x(e.unix_s)}" x2="${x(e.unix_s)}" y1="0" y2="${H}" stroke="${c}" stroke-dasharray="3,3"><title>${esc(e.kind + ": " + e.text)}</title></line>`;
  }
  if (pts.length > 1) {
    out += `<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="${pts.map(p => x(p[0]).toFixed(1) + "," + y(p[col]).toFixed(1)).join(" ")}"/>`;
  }
  out += `<text x="6" y="14" font-size="11" fill="#555">max ${max.toPrecision(3)}</text>`;
  out += `<text x="${W - 6}" y="${H - 6}" font-size="11" fill="#555" text-anchor="end">${Math.round(span / 60)} min</text>`;
  svg.innerHTML = out;
}
function render(j) {
  const chips = [chip("state", j.state, "state"), chip("round", j.round, "round"),
    chip("world size", j.world_size, "world"), chip("nodes", j.nodes, "nodes"),
    chip("restarts", j.restart_count, "restarts"), chip("samples/s", fmt(j.samples_per_s, 1), "samples"),
    chip("steps/s", fmt(j.steps_per_s, 2), "steps"), chip("step time s", fmt(j.step_time_s, 4), "steptime"),
    chip("data age s", fmt(j.data_age_s, 1), "age"), chip("hang detection", j.hang_state + (j.hang_timeout_s > 0 ? " (" + j.hang_timeout_s + " s, " + j.on_hang + ")" : ""), "hang")];
  const rec = j.last_recovery;  // docs/recovery.md
  if (rec) chips.push(chip("last recovery", `round ${rec.round}: ${fmt(rec.first_step_ms, 0)} ms (stopped +${fmt(rec.stopped_ms, 0)}, round +${fmt(rec.round_ms, 0)}, started +${fmt(rec.started_ms, 0)}, first step +${fmt(rec.first_step_ms, 0)}; ${rec.cause})`, "recovery"));
  $("chips").innerHTML = chips.join("");
  $("hang").hidden = !j.hang_report; $("hang").textContent = j.hang_report || "";
  const f = j.failure || {failures: []};
  const showFail = j.state === "failed" || f.failures.length > 0;
  $("failure").hidden = !showFail;
  if (showFail) {
    $("failure").textContent = "failure report" + (f.reason ? ": " + f.reason : "") + "\n" +
      f.failures.map(x => `round ${x.round} rank ${x.rank} on ${x.host} pid ${x.pid}: ` +
        (x.signal ? "signal " + x.signal : "exit " + x.exit_code) + (x.error_message ? "\n" + x.error_message : "") +
        (x.stderr_tail ? "\n" + x.stderr_tail : "")).join("\n");
  }
  const t1 = j.now_unix_s, t0 = j.series.length ? Math.max(j.series[0][0], t1 - 20 * 60) : t1 - 60;
  chart($("c_samples"), j.series, 1, j.events, t0, t1);
  chart($("c_step"), j.series, 3, j.events, t0, t1);
  const culprits = new Set();
  const m = /culprit rank\(s\) ([0-9,\-]+)/.exec(j.hang_state === "reported" ? j.hang_report : "");
  if (m) for (const part of m[1].split(",")) { const [a, b] = part.split("-").map(Number); for (let r = a; r <= (b ?? a); r++) culprits.add(r); }
  let ranks = j.ranks.slice();
  if (ranks.length > MAX_ROWS) ranks.sort((a, b) => (b.straggler - a.straggler) || (a.rank - b.rank));
  $("ranknote").textContent = ranks.length > MAX_ROWS ? `showing ${MAX_ROWS} of ${ranks.length} ranks, stragglers first` : "";
  ranks = ranks.slice(0, MAX_ROWS);
  const rows = ranks.map(r => {
    const cls = culprits.has(r.rank) ? "culprit" : r.straggler ? "straggler" : r.state !== "running" ? "notrunning" : "";
    const stepsDone = r.steps || 0;
    const comm = r.comm_seconds_total > 0 && r.step_p50_s ? fmt(100 * r.comm_seconds_total / Math.max(1e-9, stepsDone * r.step_p50_s), 0) : "n/a";
    const sc = Object.entries(r.scalars).slice(0, 6).map(([k, v]) => `${k}=${Number(v).toPrecision(4)}`).join(" ");
    return `<tr class="${cls}" data-rank="${r.rank}"><td>${r.rank}</td><td class="l">${esc(r.host)}</td><td>${r.pid}</td>` +
      `<td class="l">${esc(r.state)}</td><td class="steps">${r.steps}</td><td>${fmt(r.step_p50_s, 4)}</td><td>${fmt(r.step_p90_s, 4)}</td>` +
      `<td class="sps">${fmt(r.steps_per_s, 2)}</td><td class="samples">${fmt(r.samples_per_s, 1)}</td><td>${fmt(r.cpu_percent, 0)}</td>` +
      `<td>${fmt(r.rss_bytes / 1048576, 0)}</td><td>${fmt(r.gpu_util_percent, 0)}</td>` +
      `<td>${r.gpu_mem_bytes === null ? "n/a" : fmt(r.gpu_mem_bytes / 1048576, 0)}</td><td>${comm}</td>` +
      `<td class="ckpt">${r.checkpoint_step === null ? "" : r.checkpoint_step}</td>` +
      `<td>${r.checkpoint_step === null ? "" : fmt(r.checkpoint_bytes / 1048576, 0)}</td>` +
      `<td>${r.checkpoint_memory_bytes ? fmt(r.checkpoint_memory_bytes / 1048576, 0) : ""}</td>` +
      `<td class="strag">${r.straggler ? "+" + fmt(r.straggler_gap_s, 4) + " s" : r.slowdown ? "x" + fmt(r.slowdown, 2) : ""}</td>` +
      `<td>${fmt(r.age_s, 1)}</td><td class="l">${esc(sc)}</td></tr>`;
  });
  $("ranks").tBodies[0].innerHTML = rows.join("");
  $("events").innerHTML = j.events.slice(-100).reverse().map(e =>
    `<div><span class="muted">${new Date(e.unix_s * 1000).toLocaleTimeString()}</span> <span class="k">${esc(e.kind)}</span> round ${e.round}: ${esc(e.text)}</div>`).join("");
}
// The API's URL without the user:password a page opened with credentials in
// its URL carries (fetch refuses those; the browser's auth cache sends them).
const api = path => new URL(path, location.origin + location.pathname);
async function poll() {
  try {
    const list = await (await fetch(api("api/v1/jobs"), {cache: "no-store"})).json();
    const sel = $("job");
    const ids = list.jobs.map(j => j.job_id);
    if (!current || (!ids.includes(current) && ids.length)) current = ids[0] || "";
    sel.innerHTML = ids.map(id => `<option${id === current ? " selected" : ""}>${esc(id)}</option>`).join("");
    if (!current) { $("chips").innerHTML = chip("jobs", "none yet", "none"); $("err").textContent = ""; return; }
    const res = await fetch(api("api/v1/jobs/" + encodeURIComponent(current)), {cache: "no-store"});
    const j = await res.json();
    if (!res.ok) throw new Error(j.error || res.statusText);
    render(j);
    $("err").textContent = "";
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) { $("err").textContent = "cannot reach the server: " + e.message; }
}
$("job").addEventListener("change", e => { current = e.target.value; location.hash = encodeURIComponent(current); poll(); });
poll(); setInterval(poll, 1000);
</script></body></html>
)HTML";

}  // namespace ddprun::rendezvous
