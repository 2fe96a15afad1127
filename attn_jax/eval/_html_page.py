"""The report page's HTML, style and script (``attn_jax.eval._html`` fills in ``__TITLE__`` and ``__DATA__``).

Plain JavaScript, no library: the page must open offline from a file. Heatmaps are drawn on a canvas when a
sentence is chosen; its weights are inflated then with the browser's ``DecompressionStream``.
"""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
th[data-sort] { cursor: pointer; } th[data-sort]:hover { background: #e4e4e4; }
#sentences td.text { max-width: 22em; }
#sentences tr.row { cursor: pointer; } #sentences tr.row:hover { background: #f6f9ff; }
#sentences tr.selected { background: #dde8ff; }
.controls { margin: .5em 0; } .controls label { margin-right: 1em; }
.sig { color: #0a0; font-weight: bold; } .small { color: #666; font-size: .85em; }
#detail { border: 1px solid #aac; padding: .5em 1em; margin: 1em 0; background: #fafbff; }
#hm-wrap { position: relative; display: inline-block; }
#tip { position: absolute; pointer-events: none; background: #222; color: #fff; padding: 3px 6px;
       border-radius: 3px; font-size: 12px; white-space: nowrap; display: none; }
</style>
</head>
<body>
<h1 id="title"></h1>
<p class="small">Written by <code>attn-jax report</code> from <code>attn-jax evaluate</code>'s files.
Scores are sacreBLEU's; sentence scores: sentence BLEU (effective n-gram order) and chrF.</p>
<h2>Scores</h2>
<div id="scores"></div>
<h2>Scores by source length</h2>
<div id="by-length"></div>
<h2>Paired bootstrap resampling</h2>
<div id="significance"></div>
<h2>Sentences</h2>
<div class="controls">
<label>Source length <select id="bucket"></select></label>
<label>Show where <select id="cmp-a"></select></label>
<label>is <select id="cmp-rel">
<option value="any">better, equal or worse</option><option value="better">better than</option>
<option value="worse">worse than</option><option value="equal">equal to</option></select></label>
<select id="cmp-b"></select>
<label>by <select id="cmp-metric"><option value="bleu">sentence BLEU</option>
<option value="chrf">sentence chrF</option></select></label>
</div>
<div class="controls"><span id="count"></span>
<button id="prev">&larr; previous</button> <span id="page"></span> <button id="next">next &rarr;</button></div>
<div id="detail" hidden>
<div><b id="detail-title"></b></div>
<div class="controls">
<label>System <select id="hm-system"></select></label>
<label>Attention on <select id="hm-view"></select></label>
<label>Decoder layer <select id="hm-layer"></select></label>
<label>Head <select id="hm-head"></select></label>
</div>
<div id="hm-note" class="small"></div>
<div id="hm-wrap"><canvas id="hm"></canvas>
<div id="tip"><span id="tip-src"></span> &rarr; <span id="tip-tgt"></span>: <span id="tip-w"></span></div></div>
<div class="small">Rows: target tokens; columns: source tokens; black 0, white 1. Red squares: gold
alignments (on the reference). Weights are stored as multiples of 1/255.</div>
</div>
<table id="sentences"><thead></thead><tbody></tbody></table>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const S = D.sentences, N = S.source.length, SYS = D.systems, PAGE_ROWS = 100;
const $ = (id) => document.getElementById(id);
const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const fmt = (x) => (x === null || x === undefined || Number.isNaN(x)) ? "\u2014" : Number(x).toFixed(2);
const state = { sort: "index", dir: 1, page: 0, rows: [], selected: -1 };
const cache = new Map();

function table(head, rows) {
  return "<table><thead><tr>" + head.map((h) => "<th>" + h + "</th>").join("") + "</tr></thead><tbody>" +
    rows.map((r) => "<tr>" + r.map((c) => typeof c === "number" || c === null ?
      "<td class=num>" + fmt(c) + "</td>" : "<td>" + c + "</td>").join("") + "</tr>").join("") +
    "</tbody></table>";
}

function drawScores() {
  $("title").textContent = D.title;
  $("scores").innerHTML = table(["system", "BLEU", "chrF", "TER", "sentences", "stopped at length limit"],
    SYS.map((s) => [esc(s.name), s.bleu.score, s.chrf.score, s.ter.score, String(N),
                    String(s.stopped_at_limit ?? "\u2014")])) +
    "<div class=small>" + SYS.map((s) => esc(s.name) + ": " + esc(s.bleu.signature)).join("<br>") + "</div>";
  const head = ["source length", "sentences"];
  for (const m of ["BLEU", "chrF", "TER"]) for (const s of SYS) head.push(m + " " + esc(s.name));
  const rows = S.bucket_labels.map((label, k) => {
    const r = [label, String(SYS[0].bleu.buckets[k][1])];
    for (const m of ["bleu", "chrf", "ter"]) for (const s of SYS) r.push(s[m].buckets[k][2]);
    return r;
  });
  const all = ["all", String(N)];
  for (const m of ["bleu", "chrf", "ter"]) for (const s of SYS) all.push(s[m].score);
  $("by-length").innerHTML = table(head, [...rows, all]);
  if (!D.significance.length) {
    $("significance").innerHTML = "<p>One system: nothing to compare.</p>";
    return;
  }
  const sig = [], sigs = new Set();
  for (const p of D.significance) for (const [m, r] of Object.entries(p.metrics)) {
    sigs.add(m + ": " + r.signature);
    const star = r.p !== null && r.p < 0.05 ? " <span class=sig>*</span>" : "";
    sig.push([esc(p.a), esc(p.b), m, r.a, r.b, r.b - r.a,
              "<span class=pval>" + Number(r.p).toFixed(4) + "</span>" + star,
              fmt(r.a_mean) + " \u00b1 " + fmt(r.a_ci) + " / " + fmt(r.b_mean) + " \u00b1 " + fmt(r.b_ci)]);
  }
  $("significance").innerHTML = table(
    ["A (baseline)", "B", "metric", "A", "B", "B \u2212 A", "p-value", "bootstrap mean \u00b1 95 % CI: A / B"], sig) +
    "<div class=small>sacreBLEU's paired bootstrap resampling (<code>sacrebleu.significance.PairedTest</code>," +
    " test_type bs); * p &lt; 0.05.<br>" + [...sigs].map(esc).join("<br>") + "</div>";
}

function setupControls() {
  $("bucket").innerHTML = "<option value=-1>all</option>" +
    S.bucket_labels.map((l, k) => "<option value=" + k + ">" + esc(l) + "</option>").join("");
  const opts = SYS.map((s, k) => "<option value=" + k + ">" + esc(s.name) + "</option>").join("");
  $("cmp-a").innerHTML = opts; $("cmp-b").innerHTML = opts;
  if (SYS.length > 1) $("cmp-b").value = "1";
  for (const id of ["bucket", "cmp-a", "cmp-b", "cmp-rel", "cmp-metric"])
    $(id).addEventListener("change", () => { state.page = 0; refresh(); });
  $("prev").addEventListener("click", () => { if (state.page > 0) { state.page--; drawRows(); } });
  $("next").addEventListener("click", () => {
    if ((state.page + 1) * PAGE_ROWS < state.rows.length) { state.page++; drawRows(); }
  });
  let head = "<tr><th data-sort=index>#</th><th data-sort=length>length</th><th>source</th><th>reference</th>";
  SYS.forEach((s, k) => {
    head += "<th>" + esc(s.name) + "</th><th data-sort=bleu:" + k + ">BLEU</th><th data-sort=chrf:" + k +
      ">chrF</th>";
  });
  document.querySelector("#sentences thead").innerHTML = head + "</tr>";
  document.querySelectorAll("#sentences th[data-sort]").forEach((th) => th.addEventListener("click", () => {
    const key = th.dataset.sort;
    state.dir = state.sort === key ? -state.dir : (key === "index" ? 1 : -1);
    state.sort = key; state.page = 0; refresh();
  }));
  document.querySelector("#sentences tbody").addEventListener("click", (e) => {
    const tr = e.target.closest("tr.row");
    if (tr) select(Number(tr.dataset.index));
  });
}

function sortValue(i) {
  if (state.sort === "index") return i;
  if (state.sort === "length") return S.length[i];
  const [m, k] = state.sort.split(":");
  return SYS[Number(k)][m === "bleu" ? "sentence_bleu" : "sentence_chrf"][i];
}

function refresh() {
  const bucket = Number($("bucket").value), rel = $("cmp-rel").value;
  const a = SYS[Number($("cmp-a").value)], b = SYS[Number($("cmp-b").value)];
  const key = $("cmp-metric").value === "bleu" ? "sentence_bleu" : "sentence_chrf";
  const rows = [];
  for (let i = 0; i < N; i++) {
    if (bucket >= 0 && S.bucket[i] !== bucket) continue;
    const d = a[key][i] - b[key][i];
    if (rel === "better" && !(d > 0)) continue;
    if (rel === "worse" && !(d < 0)) continue;
    if (rel === "equal" && d !== 0) continue;
    rows.push(i);
  }
  rows.sort((x, y) => (sortValue(x) - sortValue(y)) * state.dir || x - y);
  state.rows = rows;
  drawRows();
}

function drawRows() {
  const rows = state.rows, start = state.page * PAGE_ROWS, shown = rows.slice(start, start + PAGE_ROWS);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  $("count").textContent = rows.length + " of " + N + " sentences";
  $("page").textContent = "page " + (state.page + 1) + " of " + pages;
  const html = [];
  for (const i of shown) {
    let tr = "<tr class='row" + (i === state.selected ? " selected" : "") + "' data-index=" + i + "><td class=num>" +
      i + "</td><td class=num>" + S.length[i] + "</td><td class=text>" + esc(S.source[i]) +
      "</td><td class=text>" + esc(S.reference[i]) + "</td>";
    for (const s of SYS) tr += "<td class=text>" + esc(s.hypotheses[i]) + "</td><td class=num>" +
      fmt(s.sentence_bleu[i]) + "</td><td class=num>" + fmt(s.sentence_chrf[i]) + "</td>";
    html.push(tr + "</tr>");
  }
  document.querySelector("#sentences tbody").innerHTML = html.join("");
}

// ------------------------------------------------------------------------------------------- heatmaps

function select(i) {
  state.selected = i;
  document.querySelectorAll("#sentences tr.selected").forEach((tr) => tr.classList.remove("selected"));
  const tr = document.querySelector("#sentences tr[data-index='" + i + "']");
  if (tr) tr.classList.add("selected");
  $("detail").hidden = false;
  $("detail-title").textContent = "#" + i + " (" + S.length[i] + " source words): " + S.source[i];
  const withAttention = SYS.map((s, k) => [s, k]).filter(([s]) => s.attention && Object.keys(s.attention.views).length);
  const sel = $("hm-system"), keep = sel.value;
  sel.innerHTML = withAttention.map(([s, k]) => "<option value=" + k + ">" + esc(s.name) + "</option>").join("");
  if (withAttention.some(([, k]) => String(k) === keep)) sel.value = keep;
  const missing = SYS.filter((s) => !(s.attention && Object.keys(s.attention.views).length)).map((s) =>
    esc(s.name) + ": " + (s.attention ? esc(s.attention.note || "no attention") :
                          "no attention.npz (evaluate it with --save-attention)"));
  $("hm-note").innerHTML = missing.join("; ");
  systemChanged();
}

function systemChanged() {
  const s = SYS[Number($("hm-system").value)];
  if (!s) { draw(); return; }
  const A = s.attention, views = Object.keys(A.views);
  const names = { hypothesis: "its own translation", reference: "the reference (teacher-forced)" };
  const keepView = $("hm-view").value, keepLayer = $("hm-layer").value, keepHead = $("hm-head").value;
  $("hm-view").innerHTML = views.map((v) => "<option value=" + v + ">" + names[v] + "</option>").join("");
  if (views.includes(keepView)) $("hm-view").value = keepView;
  $("hm-layer").innerHTML = Array.from({ length: A.layers }, (_, l) => "<option value=" + l + ">" + l +
    "</option>").join("");
  $("hm-layer").value = keepLayer !== "" && Number(keepLayer) < A.layers ? keepLayer : String(A.layers - 1);
  $("hm-head").innerHTML = (A.heads > 1 ? "<option value=mean>mean of heads</option>" : "") +
    Array.from({ length: A.heads }, (_, h) => "<option value=" + h + ">" + h + "</option>").join("");
  if ([...$("hm-head").options].some((o) => o.value === keepHead)) $("hm-head").value = keepHead;
  $("hm-layer").disabled = A.layers < 2; $("hm-head").disabled = A.heads < 2;
  draw();
}

async function inflate(b64) {
  const bin = atob(b64), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// The [T, S] weights (multiples of 1/255) of one sentence, system, view, layer and head ("mean": of heads).
async function matrix(k, view, i, layer, head) {
  const A = SYS[k].attention, V = A.views[view], [T, Sn] = V.shapes[i];
  if (!T) return null;
  const id = k + "/" + view + "/" + i;
  if (!cache.has(id)) cache.set(id, await inflate(V.blobs[i]));
  const q = cache.get(id), size = T * Sn, out = new Float32Array(size);
  const heads = head === "mean" ? [...Array(A.heads).keys()] : [Number(head)];
  for (const h of heads) {
    const off = (layer * A.heads + h) * size;
    for (let c = 0; c < size; c++) out[c] += q[off + c];
  }
  for (let c = 0; c < size; c++) out[c] /= 255 * heads.length;
  return { T, S: Sn, w: out };
}

let drawn = null;

async function draw() {
  const canvas = $("hm"), ctx = canvas.getContext("2d"), i = state.selected;
  const k = Number($("hm-system").value), s = SYS[k];
  $("tip").style.display = "none";
  drawn = null;
  if (!s || i < 0) { canvas.width = canvas.height = 0; return; }
  const view = $("hm-view").value, layer = Number($("hm-layer").value), head = $("hm-head").value;
  const m = await matrix(k, view, i, layer, head);
  if (state.selected !== i) return;  // another sentence was chosen meanwhile
  if (!m) { canvas.width = canvas.height = 0; $("hm-note").textContent = s.name + ": nothing decoded"; return; }
  const src = [...s.attention.source_tokens[i], "</s>"];
  const tgt = [...s.attention.views[view].target_tokens[i], "</s>"];
  const cell = Math.max(10, Math.min(24, Math.floor(640 / Math.max(m.S, m.T))));
  ctx.font = "12px sans-serif";
  const widest = (ws) => Math.max(...ws.map((w) => ctx.measureText(w).width));
  const left = Math.ceil(widest(tgt)) + 8, top = Math.ceil(widest(src)) + 8;
  const dpr = window.devicePixelRatio || 1, W = left + cell * m.S + 2, H = top + cell * m.T + 2;
  canvas.width = W * dpr; canvas.height = H * dpr;
  canvas.style.width = W + "px"; canvas.style.height = H + "px";
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  for (let r = 0; r < m.T; r++) for (let c = 0; c < m.S; c++) {
    const v = Math.round(255 * m.w[r * m.S + c]);
    ctx.fillStyle = "rgb(" + v + "," + v + "," + v + ")";
    ctx.fillRect(left + c * cell, top + r * cell, cell, cell);
  }
  ctx.font = "12px sans-serif"; ctx.fillStyle = "#222"; ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  tgt.forEach((w, r) => ctx.fillText(w, left - 4, top + (r + 0.5) * cell));
  ctx.textAlign = "left";
  src.forEach((w, c) => {
    ctx.save(); ctx.translate(left + (c + 0.5) * cell, top - 4); ctx.rotate(-Math.PI / 2);
    ctx.fillText(w, 0, 0); ctx.restore();
  });
  const gold = view === "reference" && s.attention.gold ? s.attention.gold[i] : null;
  if (gold) {
    ctx.strokeStyle = "#e00"; ctx.lineWidth = 2;
    for (const link of gold.split(/\s+/).filter(Boolean)) {
      const [a, b] = link.split(/[-?]/).map(Number);
      ctx.strokeRect(left + a * cell + 2, top + b * cell + 2, cell - 4, cell - 4);
    }
  }
  drawn = { m, src, tgt, left, top, cell, view, layer, head, system: k, index: i };
  Object.assign(canvas.dataset, { left, top, cell, rows: m.T, cols: m.S, system: k, view, layer, head, index: i });
}

$("hm").addEventListener("mousemove", (e) => {
  const tip = $("tip");
  if (!drawn) { tip.style.display = "none"; return; }
  const rect = e.target.getBoundingClientRect(), x = e.clientX - rect.left, y = e.clientY - rect.top;
  const c = Math.floor((x - drawn.left) / drawn.cell), r = Math.floor((y - drawn.top) / drawn.cell);
  if (c < 0 || r < 0 || c >= drawn.m.S || r >= drawn.m.T) { tip.style.display = "none"; return; }
  $("tip-src").textContent = drawn.src[c];
  $("tip-tgt").textContent = drawn.tgt[r];
  $("tip-w").textContent = drawn.m.w[r * drawn.m.S + c].toFixed(3);
  Object.assign(tip.dataset, { row: r, col: c });
  tip.style.display = "block";
  tip.style.left = (x + 12) + "px"; tip.style.top = (y + 12) + "px";
});
$("hm").addEventListener("mouseleave", () => { $("tip").style.display = "none"; });
$("hm-system").addEventListener("change", systemChanged);
for (const id of ["hm-view", "hm-layer", "hm-head"]) $(id).addEventListener("change", draw);

drawScores();
setupControls();
refresh();
document.body.dataset.ready = "1";
</script>
</body>
</html>
"""
