/* costlab dashboard charts: draws the series the page embeds (#dashboard-data, and the quality chart's
 * #quality-data), then polls the page's live endpoint once a second with a `since` cursor and appends
 * what is new.
 * No inline handlers, no eval: a static file, after plain.js and lazy.js. Each chart is queued with
 * costlabLazy.draw: drawn once plotly.js is there, after the load event, those in view first. Until a
 * chart is drawn, what the live endpoint sends for it is kept with the page's data, and drawn with it. */
(function () {
  "use strict";

  var dataEl = document.getElementById("dashboard-data");
  var root = document.getElementById("dashboard");
  if (!dataEl || !root || !window.costlabLazy || !window.costlabPlain || !window.costlabLegend) { return; }
  var lazy = window.costlabLazy;
  var cfg = JSON.parse(dataEl.textContent);
  var PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  var MAX_POINTS = 5000; // per trace, while live points accumulate
  var statusEl = document.getElementById("live-status");

  function setStatus(text, cls) {
    if (!statusEl) { return; }
    statusEl.textContent = text;
    statusEl.className = "live-status small " + (cls || "muted");
  }

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // Every chart's frame. Its legend is HTML beside it (legend.js), never in the figure: there it covers
  // the axis titles at a phone's width and scrolls with many runs. Title, tick labels and axis titles
  // push the margins as far as they need (automargin): nothing clipped, nothing drawn over another.
  function layout(yTitle, extra) {
    extra = extra || {};
    var base = {
      height: 300, margin: { l: 8, r: 14, t: 8, b: 8 }, showlegend: false,
      xaxis: { type: "date", automargin: true, ticklabelstandoff: 6, title: { text: "time (UTC)", standoff: 6 } },
      yaxis: { automargin: true, title: { text: yTitle, standoff: 8 }, rangemode: "tozero" },
      hovermode: "closest", hoverlabel: { namelength: -1 }, // whole run names
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff"
    };
    ["xaxis", "yaxis"].forEach(function (k) { if (extra[k]) { extra[k] = Object.assign({}, base[k], extra[k]); } });
    return Object.assign(base, extra);
  }

  // A chart's title, top left, in a margin of its own (it never meets the y axis' title or ticks).
  function chartTitle(text, size) {
    return { text: text, font: { size: size || 14 }, x: 0.01, xanchor: "left", yref: "container", y: 1,
      yanchor: "top", pad: { t: 6 }, automargin: true };
  }

  // A legend for one chart, in the figure after it (legend.js); setLegend fills it and shows the
  // traces about to be drawn as it says (a line shown alone stays alone through a redraw).
  var legends = {};
  function chartLegend(el) {
    if (!legends[el.id]) {
      var box = document.createElement("div");
      el.parentNode.insertBefore(box, el.nextSibling);
      legends[el.id] = window.costlabLegend(box, function () { return [el]; });
    }
    return legends[el.id];
  }
  function setLegend(legend, entries, traces) {
    legend.set(entries);
    traces.forEach(function (t) { t.visible = legend.visible(t.legendgroup); });
  }

  var plain = window.costlabPlain; // labels from data are text, never markup (plain.js)

  // An empty chart says so in words, with no axes (Plotly would draw a Jan-Dec 2000 date axis).
  function emptyLayout(extra, text) {
    extra.annotations = (extra.annotations || []).concat([{ text: text, showarrow: false, xref: "paper",
      yref: "paper", x: 0.5, y: 0.5, font: { color: "#888", size: 13 } }]);
    extra.xaxis = { visible: false };
    extra.yaxis = { visible: false };
    return extra;
  }

  // The y axis says the unit; the chart's title says what it is ("Power" over "W"): a whole label on
  // both ran into the title at the top of a phone's chart.
  function axisTitle(meta) {
    return plain(meta.unit || "");
  }

  // ---------------------------------------------------------------- telemetry (one chart per field)
  var tele = cfg.telemetry;
  var charts = {}; // field -> {el, index: {runId: [lo, hi, mean] trace indices}, lastX: {runId: x}, count}
  var anyEstimated = false;

  // Runs of one arm: distinct shades of the arm's colour (the first run the colour itself, then
  // alternately darker and lighter), in the order the page first sees them.
  var shadeOf = {}, shadesUsed = {};
  var SHADES = [0, -0.3, 0.35, -0.5, 0.55, -0.15, 0.2, -0.4, 0.45, 0.65];
  function shade(hex, amount) {
    var n = parseInt(hex.slice(1), 16), rgb = [n >> 16, (n >> 8) & 255, n & 255];
    return "#" + rgb.map(function (c) {
      var v = amount < 0 ? c * (1 + amount) : c + (255 - c) * amount;
      return ("0" + Math.round(v).toString(16)).slice(-2);
    }).join("");
  }
  function armColor(runId) {
    var run = tele.runs[runId];
    var arm = run && cfg.arms[String(run.arm)];
    if (!arm) { return "#555"; }
    if (shadeOf[runId] === undefined) {
      var k = shadesUsed[run.arm] || 0;
      shadesUsed[run.arm] = k + 1;
      shadeOf[runId] = SHADES[k % SHADES.length];
    }
    return shade(arm.color, shadeOf[runId]);
  }

  // A gap in a run's samples (a retried run waiting for its next attempt, a lost worker) is a break
  // in its line, not a straight segment across: a null point where consecutive samples are further
  // apart than GAP_FACTOR times the run's usual interval (and at least GAP_MIN_MS).
  var GAP_FACTOR = 5, GAP_MIN_MS = 10000;
  function usualStep(xs) {
    var d = [];
    for (var i = 1; i < xs.length; i++) { d.push(xs[i] - xs[i - 1]); }
    d.sort(function (a, b) { return a - b; });
    return d.length ? d[Math.floor(d.length / 2)] : 1000;
  }
  function withBreaks(band, lastX, step) {
    var out = emptyBand(), prev = lastX, limit = Math.max(GAP_MIN_MS, GAP_FACTOR * step);
    for (var i = 0; i < band.x.length; i++) {
      if (prev !== undefined && prev !== null && isFinite(prev) && band.x[i] - prev > limit) {
        out.x.push(prev + 1); out.y.push(null); out.lo.push(null); out.hi.push(null);
      }
      out.x.push(band.x[i]); out.y.push(band.y[i]); out.lo.push(band.lo[i]); out.hi.push(band.hi[i]);
      prev = band.x[i];
    }
    return out;
  }

  // ---------------------------------------------------------------- x axis: time, since start, step, tokens
  // A trace's data stay in epoch ms (times[runId], the x of its three traces); what is drawn is that
  // time shown as the toggle says: time of day; seconds since the run's first sample ("since start"
  // lays runs that trained at different times over each other); or the step, or the cumulative tokens,
  // the run had reached then (read off tele.progress, each run's step and tokens against time: curves
  // of runs that step at different speeds compared step for step, or token for token).
  var xMode = "time";
  var runOrigin = {}; // run id -> its first sample's x (epoch ms)
  var progress = tele.progress || {}; // run id -> {step: {x, y}, tokens: {x, y}}
  var X_AXES = {
    time: { type: "date", title: { text: "time (UTC)" } },
    elapsed: { type: "linear", title: { text: "time since the run started (s)" }, rangemode: "tozero" },
    step: { type: "linear", title: { text: "step" }, rangemode: "tozero" },
    tokens: { type: "linear", title: { text: "tokens trained" }, rangemode: "tozero", tickformat: "~s" }
  };
  function noteOrigin(runId, xs) {
    for (var i = 0; i < xs.length; i++) {
      if (xs[i] !== null && (runOrigin[runId] === undefined || xs[i] < runOrigin[runId])) { runOrigin[runId] = xs[i]; }
    }
  }
  // New progress points (after the last one kept) from a live update.
  function addProgress(update) {
    Object.keys(update || {}).forEach(function (runId) {
      var have = progress[runId] = progress[runId] || {};
      Object.keys(update[runId]).forEach(function (k) {
        var kept = have[k] = have[k] || { x: [], y: [] }, fresh = update[runId][k];
        var last = kept.x.length ? kept.x[kept.x.length - 1] : -Infinity;
        for (var i = 0; i < fresh.x.length; i++) {
          if (fresh.x[i] > last) { kept.x.push(fresh.x[i]); kept.y.push(fresh.y[i]); last = fresh.x[i]; }
        }
      });
    });
  }
  // The value of a series ({x, y}, x ascending) at time t: linear between its points; null outside.
  function valueAt(series, t) {
    var xs = series.x, lo = 0, hi = xs.length - 1;
    if (hi < 0 || t < xs[0] || t > xs[hi]) { return null; }
    while (hi - lo > 1) {
      var mid = (lo + hi) >> 1;
      if (xs[mid] <= t) { lo = mid; } else { hi = mid; }
    }
    if (xs[hi] === xs[lo]) { return series.y[lo]; }
    return series.y[lo] + (series.y[hi] - series.y[lo]) * (t - xs[lo]) / (xs[hi] - xs[lo]);
  }
  function shown(runId, xs) {
    if (xMode === "time") { return xs.slice(); }
    if (xMode === "elapsed") {
      var x0 = runOrigin[runId] || 0;
      return xs.map(function (t) { return t === null ? null : (t - x0) / 1000; });
    }
    var by = (progress[runId] || {})[xMode];
    return xs.map(function (t) { return by && t !== null ? valueAt(by, t) : null; });
  }
  function xAxis() {
    var axis = X_AXES[xMode];
    return Object.assign({ automargin: true, ticklabelstandoff: 6 }, axis,
      { title: { text: axis.title.text, standoff: 6 } });
  }
  function setXMode(mode) {
    if (mode === xMode || !X_AXES[mode]) { return; }
    xMode = mode;
    Object.keys(charts).forEach(function (field) {
      var state = charts[field], el = state.el;
      if (!el.data || !el.data.length) { return; }
      Plotly.restyle(el, { x: el.data.map(function (t) { return shown(t.meta, state.times[t.meta] || []); }) });
      Plotly.relayout(el, { xaxis: xAxis() });
    });
    Array.prototype.forEach.call(document.querySelectorAll("[data-xaxis]"), function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.xaxis === mode));
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("[data-xaxis]"), function (b) {
    b.addEventListener("click", function () { setXMode(b.dataset.xaxis); });
  });

  function runTraces(field, runId, band) {
    var run = tele.runs[runId] || { label: "run " + runId, estimated: false };
    noteOrigin(runId, band.x);
    var x = shown(runId, band.x);
    var color = armColor(runId);
    var estimated = run.estimated && field === "power_w";
    if (estimated) { anyEstimated = true; }
    var name = plain(run.label + (estimated ? " (estimated)" : ""));
    var group = "run-" + runId, visible = runLegend ? runLegend.visible(group) : true;
    return [
      { x: x, y: band.lo, type: "scatter", mode: "lines", line: { width: 0, color: color }, meta: runId,
        hoverinfo: "skip", showlegend: false, legendgroup: group, name: name + " min", visible: visible },
      { x: x, y: band.hi, type: "scatter", mode: "lines", line: { width: 0, color: color }, meta: runId,
        fill: "tonexty", fillcolor: rgba(color, 0.15), hoverinfo: "skip", showlegend: false,
        legendgroup: group, name: name + " max", visible: visible },
      { x: x, y: band.y, type: "scatter", mode: "lines", name: name, legendgroup: group, meta: runId,
        line: { width: 1.6, color: color, dash: estimated ? "dot" : "solid" }, visible: visible }
    ];
  }

  // One legend for all the telemetry charts, above them: the same runs in the same colours on each, so
  // a dozen entries once, not under every chart (where they outgrew the plots at a phone's width). A
  // click on a run shows it alone on every chart.
  var runLegend = null;
  function drawRunLegend() {
    var first = root.querySelector('.chart[data-kind="telemetry"]');
    if (!first) { return; }
    if (!runLegend) {
      var grid = first.closest(".charts") || first;
      var box = document.createElement("div");
      box.id = "telemetry-legend";
      grid.parentNode.insertBefore(box, grid);
      runLegend = window.costlabLegend(box, function () {
        return Object.keys(charts).map(function (f) { return charts[f].el; });
      });
    }
    runLegend.set(Object.keys(tele.runs).map(function (runId) {
      var run = tele.runs[runId];
      return { group: "run-" + runId, name: run.label + (run.estimated ? " (power estimated)" : ""),
        color: armColor(runId) };
    }));
  }

  function emptyBand() { return { x: [], y: [], lo: [], hi: [] }; }

  var queued = {}; // field -> true while its chart waits to be drawn (its data: tele.series[field])
  function drawTelemetry() {
    Object.keys(tele.series).forEach(function (field) {
      Object.keys(tele.series[field]).forEach(function (runId) { noteOrigin(runId, tele.series[field][runId].x); });
    });
    drawRunLegend();
    var els = root.querySelectorAll('.chart[data-kind="telemetry"]');
    Array.prototype.forEach.call(els, function (el) {
      queued[el.dataset.field] = true;
      lazy.draw(el, function () { drawTelemetryChart(el); });
    });
  }

  function drawTelemetryChart(el) {
    var field = el.dataset.field;
    var meta = tele.fields[field];
    var series = tele.series[field] || {};
    var traces = [];
    var state = { el: el, index: {}, lastX: {}, count: 0, times: {} };
    Object.keys(series).forEach(function (runId) {
      state.step = state.step || {};
      state.step[runId] = usualStep(series[runId].x);
      var band = withBreaks(series[runId], undefined, state.step[runId]);
      state.times[runId] = band.x.slice();
      state.index[runId] = [traces.length, traces.length + 1, traces.length + 2];
      state.lastX[runId] = band.x.length ? band.x[band.x.length - 1] : -Infinity;
      state.count += 3;
      Array.prototype.push.apply(traces, runTraces(field, runId, band));
    });
    delete queued[field];
    charts[field] = state;
    // xAxis(): the toggle may have been used before this chart was drawn.
    var extra = { title: chartTitle(plain(meta.label)), xaxis: xAxis() };
    // A loss curve is read by its fall, not against zero.
    if (field === "loss") { extra.yaxis = { rangemode: "normal" }; }
    if (!traces.length) { emptyLayout(extra, "no telemetry yet: this fills in when a run starts training"); }
    Plotly.newPlot(el, traces, layout(axisTitle(meta), extra), PLOT_CONFIG);
    showEstimatedNote();
  }

  // The points of band after x = last (the live endpoint may resend the bucket it last sent).
  function after(band, last) {
    var fresh = emptyBand();
    for (var i = 0; i < band.x.length; i++) {
      if (band.x[i] > last) {
        fresh.x.push(band.x[i]); fresh.y.push(band.y[i]); fresh.lo.push(band.lo[i]); fresh.hi.push(band.hi[i]);
      }
    }
    return fresh;
  }

  // A chart not drawn yet: keep the new points with the page's series (at most MAX_POINTS a run); the
  // chart draws them all, breaks included, when its turn comes. Returns the newest x kept, or null.
  function keepForLater(field, update) {
    var stored = tele.series[field] = tele.series[field] || {};
    var newest = null;
    Object.keys(update).forEach(function (runId) {
      var have = stored[runId] = stored[runId] || emptyBand();
      var fresh = after(update[runId], have.x.length ? have.x[have.x.length - 1] : -Infinity);
      if (!fresh.x.length) { return; }
      ["x", "y", "lo", "hi"].forEach(function (k) { have[k] = have[k].concat(fresh[k]).slice(-MAX_POINTS); });
      newest = Math.max(newest || 0, fresh.x[fresh.x.length - 1]);
    });
    return newest;
  }

  function showEstimatedNote() {
    if (!anyEstimated) { return; }
    Array.prototype.forEach.call(document.querySelectorAll(".est-note"), function (n) { n.hidden = false; });
  }

  function appendTelemetry(update) {
    var runsBefore = JSON.stringify(tele.runs);
    Object.keys(update.runs || {}).forEach(function (runId) {
      if (!tele.runs[runId]) { tele.runs[runId] = update.runs[runId]; }
      if (update.runs[runId].estimated) { tele.runs[runId].estimated = true; }
    });
    if (JSON.stringify(tele.runs) !== runsBefore) { drawRunLegend(); }
    addProgress(update.progress);
    var newest = null;
    Object.keys(update.series || {}).forEach(function (field) {
      var state = charts[field];
      if (!state) {
        if (queued[field]) {
          var kept = keepForLater(field, update.series[field]);
          if (kept) { newest = Math.max(newest || 0, kept); }
        }
        return;
      }
      Object.keys(update.series[field]).forEach(function (runId) {
        var last = state.lastX[runId] === undefined ? -Infinity : state.lastX[runId];
        var fresh = after(update.series[field][runId], last);
        if (!fresh.x.length) { return; }
        state.step = state.step || {};
        if (!state.step[runId]) { state.step[runId] = usualStep(fresh.x); }
        fresh = withBreaks(fresh, state.lastX[runId], state.step[runId]);
        state.lastX[runId] = fresh.x[fresh.x.length - 1];
        state.times[runId] = (state.times[runId] || []).concat(fresh.x).slice(-MAX_POINTS);
        newest = Math.max(newest || 0, state.lastX[runId]);
        if (state.index[runId] === undefined) {
          if (state.count === 0) {
            Plotly.relayout(state.el, { annotations: [], xaxis: xAxis(), "yaxis.visible": true });
          }
          state.index[runId] = [state.count, state.count + 1, state.count + 2];
          state.count += 3;
          Plotly.addTraces(state.el, runTraces(field, runId, fresh));
        } else {
          var fx = shown(runId, fresh.x);
          Plotly.extendTraces(state.el, { x: [fx, fx, fx], y: [fresh.lo, fresh.hi, fresh.y] },
            state.index[runId], MAX_POINTS);
        }
      });
    });
    showEstimatedNote();
    return newest;
  }

  // ---------------------------------------------------------------- attribution
  // Each chart: drawn now if it is already, else queued once; a queued chart draws the newest data.
  var attrNow = null, drawn = {};
  function whenDrawn(el, draw) {
    if (drawn[el.id] === "drawn") { draw(el); return; }
    if (drawn[el.id] === "queued") { return; }
    drawn[el.id] = "queued";
    lazy.draw(el, function () { drawn[el.id] = "drawn"; draw(el); });
  }

  function drawAttribution(attr) {
    var devEl = document.getElementById("chart-deviation");
    var wEl = document.getElementById("chart-weights");
    if (!devEl || !wEl || !attr) { return; }
    attrNow = attr;
    whenDrawn(devEl, function (el) { drawDeviation(el, attrNow); });
    whenDrawn(wEl, function (el) { drawWeights(el, attrNow); });
  }

  function drawDeviation(devEl, attr) {
    var traces = [], entries = [], legend = chartLegend(devEl);
    Object.keys(attr.deviation).forEach(function (armId) {
      var arm = cfg.arms[armId] || { name: "arm " + armId, color: "#555" };
      var d = attr.deviation[armId];
      if (d.x.length) { entries.push({ group: armId, name: arm.name, color: arm.color }); }
      var lo = [], hi = [], x = [];
      for (var i = 0; i < d.x.length; i++) {
        if (d.lo[i] !== null && d.hi[i] !== null) { x.push(d.x[i]); lo.push(d.lo[i]); hi.push(d.hi[i]); }
      }
      traces.push({ x: x, y: lo, type: "scatter", mode: "lines", line: { width: 0, color: arm.color },
        hoverinfo: "skip", showlegend: false, legendgroup: armId });
      traces.push({ x: x, y: hi, type: "scatter", mode: "lines", line: { width: 0, color: arm.color },
        fill: "tonexty", fillcolor: rgba(arm.color, 0.15), hoverinfo: "skip", showlegend: false, legendgroup: armId });
      traces.push({ x: d.x, y: d.y, type: "scatter", mode: "lines+markers", marker: { size: 4 },
        name: plain(arm.name), legendgroup: armId, line: { color: arm.color } });
    });
    ["freeze", "unfreeze"].forEach(function (action) {
      var events = attr.freezes.filter(function (f) { return f.action === action; });
      if (events.length) {
        entries.push(action === "freeze" ? { group: action, name: "freeze", symbol: "\u00d7", color: "#c0392b" }
          : { group: action, name: "unfreeze", symbol: "\u25cb", color: "#2a9d5c" });
      }
      traces.push({ legendgroup: action,
        x: events.map(function (f) { return f.x; }), y: events.map(function (f) { return f.y; }),
        text: events.map(function (f) { return plain(((cfg.arms[String(f.arm)] || {}).name || "arm") + ": " + f.reason); }),
        type: "scatter", mode: "markers", name: action === "freeze" ? "freeze" : "unfreeze",
        hovertemplate: "%{text}<extra>" + action + "</extra>",
        marker: action === "freeze"
          ? { symbol: "x", size: 14, color: "#c0392b", line: { width: 2 } }
          : { symbol: "circle-open", size: 13, color: "#2a9d5c", line: { width: 2 } }
      });
    });
    var shapes = [{ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: attr.threshold_pct, y1: attr.threshold_pct,
      line: { color: "#c0392b", width: 1.5, dash: "dash" } }];
    attr.freezes.forEach(function (f) {
      shapes.push({ type: "line", xref: "x", x0: f.x, x1: f.x, yref: "paper", y0: 0, y1: 1,
        line: { color: f.action === "freeze" ? "#c0392b" : "#2a9d5c", width: 1, dash: "dot" } });
    });
    var annotations = [{ xref: "paper", x: 1, xanchor: "right", yref: "y", y: attr.threshold_pct, yanchor: "bottom",
      text: "freeze threshold +" + attr.threshold_pct + " %", showarrow: false, font: { color: "#c0392b", size: 11 } }];
    var devExtra = {};
    if (!Object.keys(attr.deviation).some(function (k) { return attr.deviation[k].x.length; })) {
      // Say why, as the header does: windows may exist while no deviation is estimable yet.
      emptyLayout(devExtra, attr.attributed
        ? "attributed, but no deviation yet: each arm needs 2 priced runs"
        : "no attribution window yet");
      annotations = devExtra.annotations;
      shapes = [];
    }
    setLegend(legend, entries, traces);
    Plotly.react(devEl, traces, layout("deviation vs control (%)", Object.assign({
      shapes: shapes, annotations: annotations, yaxis: { title: { text: "deviation vs control (%)" }, zeroline: true },
      title: chartTitle("Deviation timeline")
    }, devExtra.xaxis ? { xaxis: devExtra.xaxis, yaxis: devExtra.yaxis } : {})), PLOT_CONFIG);
  }

  function drawWeights(wEl, attr) {
    var legend = chartLegend(wEl), entries = [];
    var wTraces = Object.keys(attr.weights).map(function (armId) {
      var arm = cfg.arms[armId] || { name: "arm " + armId, color: "#555" };
      var w = attr.weights[armId];
      entries.push({ group: armId, name: arm.name, color: arm.color });
      return { x: w.x, y: w.y, type: "scatter", mode: "lines", name: plain(arm.name), legendgroup: armId,
        line: { shape: "hv", color: arm.color, width: 2 } };
    });
    setLegend(legend, entries, wTraces);
    Plotly.react(wEl, wTraces, layout("traffic weight (relative)", { title: chartTitle("Weights over time") }),
      PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- held-out quality against cost
  // Its data come with the comparison (#quality-data, inside the fragment the page refetches): drawn
  // once plotly.js is there, redrawn when a refresh brings different data.
  var qualityText = null;
  function drawQualityData() {
    var el = document.getElementById("chart-quality");
    var node = document.getElementById("quality-data");
    if (!el || !node || node.textContent === qualityText) { return; }
    qualityText = node.textContent;
    whenDrawn(el, function (chart) { drawQuality(chart, JSON.parse(qualityText)); });
  }

  function drawQuality(el, q) {
    var traces = [], inLegend = {}, control = null, legend = chartLegend(el), entries = [];
    Object.keys(cfg.arms).forEach(function (id) { if (cfg.arms[id].control) { control = cfg.arms[id]; } });
    // One line per run in its arm's colour; one legend entry per arm (a click shows that arm alone).
    q.runs.forEach(function (r) {
      var arm = cfg.arms[String(r.arm)] || { name: "arm " + r.arm };
      var label = plain(r.label) + (r.finished ? "" : " (not finished)");
      if (!inLegend[r.arm]) { entries.push({ group: "arm-" + r.arm, name: arm.name, color: r.color }); }
      traces.push({ x: r.x, y: r.y, type: "scatter", mode: "lines+markers", marker: { size: 5 },
        name: plain(arm.name), legendgroup: "arm-" + r.arm, showlegend: !inLegend[r.arm],
        line: { color: r.color, width: 1.6, dash: r.finished ? "solid" : "dot" },
        text: r.tokens.map(function (t) { return label + "<br>" + Number(t).toLocaleString("en") + " tokens"; }),
        hovertemplate: "%{text}<br>" + plain(q.metric) + " %{y:.4g} at %{x:.4g} USD (est.)<extra></extra>" });
      inLegend[r.arm] = true;
    });
    var extra = {
      title: chartTitle(plain(q.title)),
      xaxis: { type: "linear", title: { text: plain(q.x_title), standoff: 6 }, rangemode: "tozero" },
      yaxis: { title: { text: plain(q.y_title) } }
    };
    if (q.target !== null && q.target !== undefined) {
      var color = control ? control.color : "#555";
      extra.shapes = [{ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: q.target, y1: q.target,
        line: { color: color, width: 1.5, dash: "dash" } }];
      extra.annotations = [{ xref: "paper", x: 1, xanchor: "right", yref: "y", y: q.target, yanchor: "bottom",
        text: "control's final " + plain(q.metric) + " " + Number(q.target).toPrecision(4), showarrow: false,
        font: { color: "#555", size: 11 } }];
    }
    if (!traces.length) {
      emptyLayout(extra, "No held-out evaluations yet: add an `eval:` section to the strategy,<br>or log " +
        plain(q.metric) + " from the SDK");
    }
    setLegend(legend, entries, traces);
    Plotly.react(el, traces, layout(plain(q.y_title), extra), PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- a run's cost breakdown
  function drawCost(cost) {
    var usedEl = document.getElementById("chart-used-idle");
    var resEl = document.getElementById("chart-resources");
    if (!cost || !usedEl || !resEl) { return; }
    whenDrawn(usedEl, function (el) { drawUsedIdle(el, cost); });
    whenDrawn(resEl, function (el) { drawResources(el, cost); });
  }

  // A new object each time: Plotly keeps (and fills in) the layout it is given.
  function small(title) {
    return { title: chartTitle(title), height: 220, margin: { l: 8, r: 16, t: 8, b: 8 },
      showlegend: false, xaxis: { title: { text: "USD" }, rangemode: "tozero", tickformat: "~r", automargin: true },
      yaxis: { automargin: true } };
  }

  function drawUsedIdle(usedEl, cost) {
    Plotly.newPlot(usedEl, [{ type: "bar", orientation: "h", y: ["used", "idle"],
      x: [cost.used_idle.used, cost.used_idle.idle], marker: { color: ["#1f6fb4", "#bbb"] },
      hovertemplate: "%{y}: %{x:.4g} USD<extra></extra>" }], small("Used vs idle"), PLOT_CONFIG);
  }

  function drawResources(resEl, cost) {
    var names = Object.keys(cost.resources);
    // A component with no price reads null: labelled "unpriced", drawn as no bar (never $0).
    var labels = names.map(function (n) {
      if (cost.resources[n] === null) { return n + " (unpriced)"; }
      return n === "energy" && cost.energy_estimated ? "energy (est.)" : n;
    });
    Plotly.newPlot(resEl, [{ type: "bar", orientation: "h", y: labels,
      x: names.map(function (n) { return cost.resources[n]; }), marker: { color: "#2a9d5c" },
      hovertemplate: "%{y}: %{x:.4g} USD<extra></extra>" }], small("Energy vs device-hours and the rest"), PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- a run's training metrics
  // One small chart per metric, by step (#dashboard-data's metrics: downsampled by the server; a
  // bucketed series draws its min-max band under the mean).
  function drawMetrics(metrics) {
    var els = document.querySelectorAll('.chart[data-kind="metric"]');
    Array.prototype.forEach.call(els, function (el) {
      var s = metrics.series[el.dataset.metric];
      if (s) { whenDrawn(el, function (chart) { drawMetric(chart, s); }); }
    });
  }

  function drawMetric(el, s) {
    var color = "#1f6fb4", traces = [];
    if (s.min && s.max) {
      traces.push({ x: s.step, y: s.min, type: "scatter", mode: "lines", line: { width: 0, color: color },
        hoverinfo: "skip", showlegend: false });
      traces.push({ x: s.step, y: s.max, type: "scatter", mode: "lines", line: { width: 0, color: color },
        fill: "tonexty", fillcolor: rgba(color, 0.15), hoverinfo: "skip", showlegend: false });
    }
    var name = plain(s.name);
    traces.push({ x: s.step, y: s.value, type: "scatter", mode: s.step.length > 1 ? "lines" : "markers",
      line: { width: 1.6, color: color }, name: name, showlegend: false,
      hovertemplate: name + " %{y:.4g} at step %{x}<extra></extra>" });
    var last = s.value.length ? s.value[s.value.length - 1] : null;
    var title = name + (last === null ? "" : " · last " + Number(last).toPrecision(4));
    Plotly.newPlot(el, traces, layout(name, {
      height: 240, title: chartTitle(title, 13),
      xaxis: { type: "linear", title: { text: "step", standoff: 6 }, rangemode: "tozero" },
      yaxis: { title: { text: "" }, rangemode: "normal", automargin: true }
    }), PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- live polling
  var cursor = cfg.cursor;
  var attributionVersion = cfg.attribution ? cfg.attribution.version : "";
  var inFlight = false;
  // A tick that came while a poll was still in flight: poll again as soon as it returns, so a slow
  // response does not add a whole interval to how long a new sample takes to show.
  var missedTick = false;
  var lastTableRefresh = Date.now();
  var lastSample = null;
  var timer = null;

  // The verdict card, run counts, comparison and recent runs: one server-rendered fragment (escaped by
  // the template engine); each of its [data-fragment] elements replaces the page's element of that id.
  function refreshComparison() {
    var url = root.dataset.comparisonUrl;
    if (!url) { return; }
    lastTableRefresh = Date.now();
    fetch(url, { credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null) { return; }
      var doc = new DOMParser().parseFromString(html, "text/html");
      Array.prototype.forEach.call(doc.querySelectorAll("[data-fragment]"), function (part) {
        var target = document.getElementById(part.id);
        if (target) { target.replaceWith(document.importNode(part, true)); }
      });
      drawQualityData();
    }).catch(function () { /* the next poll retries */ });
  }

  // A run that appears, or whose status changes, changes the counts and the recent runs: refresh now.
  var runStatus = {};
  Object.keys(tele.runs).forEach(function (id) { runStatus[id] = tele.runs[id].status; });
  function runsMoved(update) {
    var moved = false;
    Object.keys(update.runs || {}).forEach(function (id) {
      if (runStatus[id] !== update.runs[id].status) { moved = true; }
      runStatus[id] = update.runs[id].status;
    });
    return moved;
  }

  function poll() {
    if (document.hidden) { return; }
    if (inFlight) { missedTick = true; return; }
    inFlight = true;
    missedTick = false;
    var url = root.dataset.liveUrl + "?since=" + encodeURIComponent(cursor) + "&av=" + encodeURIComponent(attributionVersion);
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.status === 401) { throw new Error("signed-out"); }
      if (r.status === 400) { window.location.reload(); throw new Error("stale"); }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.json();
    }).then(function (update) {
      cursor = update.cursor;
      var newest = appendTelemetry(update);
      if (newest) { lastSample = newest; }
      var moved = runsMoved(update);
      if (update.attribution) {
        attributionVersion = update.attribution.version;
        drawAttribution(update.attribution);
        refreshComparison();
      } else if (moved || Date.now() - lastTableRefresh > (update.active ? 10000 : 30000)) {
        refreshComparison();
      }
      var when = lastSample ? " · last sample " + new Date(lastSample).toISOString().slice(11, 19) + " UTC" : "";
      setStatus(update.active ? "● live, updated every second" + when : "no run training now; watching for new ones" + when,
        update.active ? "live" : "muted");
    }).catch(function (err) {
      if (err.message === "signed-out") {
        setStatus("signed out: reload the page to sign in", "warn");
        window.clearInterval(timer);
      } else if (err.message !== "stale") {
        setStatus("connection lost; retrying…", "warn");
      }
      missedTick = false;
    }).then(function () {
      inFlight = false;
      if (missedTick) { poll(); }
    });
  }

  drawQualityData();
  drawTelemetry();
  if (cfg.attribution) { drawAttribution(cfg.attribution); }
  if (cfg.cost) { drawCost(cfg.cost); }
  if (cfg.metrics) { drawMetrics(cfg.metrics); }
  if (root.dataset.liveUrl) {
    timer = window.setInterval(poll, cfg.poll_ms || 1000);
    poll();
  } else {
    setStatus("");
  }
})();
