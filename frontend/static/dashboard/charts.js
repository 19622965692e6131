/* costlab dashboard charts: draws the series the page embeds (#dashboard-data), then polls the
 * page's live endpoint once a second with a `since` cursor and appends what is new.
 * No inline handlers, no eval: loaded as a static file after plotly.min.js. */
(function () {
  "use strict";

  var dataEl = document.getElementById("dashboard-data");
  var root = document.getElementById("dashboard");
  if (!dataEl || !root || !window.Plotly || !window.costlabPlain) { return; }
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

  function layout(yTitle, extra) {
    var base = {
      height: 300, margin: { l: 64, r: 16, t: 30, b: 40 },
      xaxis: { type: "date", title: { text: "time (UTC)", standoff: 4 } },
      yaxis: { title: { text: yTitle }, rangemode: "tozero" },
      legend: { orientation: "h", y: -0.42, yanchor: "top", font: { size: 11 } }, hovermode: "closest",
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff"
    };
    return Object.assign(base, extra || {});
  }

  var plain = window.costlabPlain; // labels from data are text, never markup (plain.js)

  function axisTitle(meta) {
    return plain(meta.unit ? meta.label + " (" + meta.unit + ")" : meta.label);
  }

  // ---------------------------------------------------------------- telemetry (one chart per field)
  var tele = cfg.telemetry;
  var charts = {}; // field -> {el, index: {runId: [lo, hi, mean] trace indices}, lastX: {runId: x}, count}
  var anyEstimated = false;

  function armColor(runId) {
    var run = tele.runs[runId];
    var arm = run && cfg.arms[String(run.arm)];
    return arm ? arm.color : "#555";
  }

  function runTraces(field, runId, band) {
    var run = tele.runs[runId] || { label: "run " + runId, estimated: false };
    var color = armColor(runId);
    var estimated = run.estimated && field === "power_w";
    if (estimated) { anyEstimated = true; }
    var name = plain(run.label + (estimated ? " (estimated)" : ""));
    var group = "run-" + runId;
    return [
      { x: band.x, y: band.lo, type: "scatter", mode: "lines", line: { width: 0, color: color },
        hoverinfo: "skip", showlegend: false, legendgroup: group, name: name + " min" },
      { x: band.x, y: band.hi, type: "scatter", mode: "lines", line: { width: 0, color: color },
        fill: "tonexty", fillcolor: rgba(color, 0.15), hoverinfo: "skip", showlegend: false,
        legendgroup: group, name: name + " max" },
      { x: band.x, y: band.y, type: "scatter", mode: "lines", name: name, legendgroup: group,
        line: { width: 1.6, color: color, dash: estimated ? "dot" : "solid" } }
    ];
  }

  function emptyBand() { return { x: [], y: [], lo: [], hi: [] }; }

  function drawTelemetry() {
    var els = root.querySelectorAll('.chart[data-kind="telemetry"]');
    Array.prototype.forEach.call(els, function (el) {
      var field = el.dataset.field;
      var meta = tele.fields[field];
      var series = tele.series[field] || {};
      var traces = [];
      var state = { el: el, index: {}, lastX: {}, count: 0 };
      Object.keys(series).forEach(function (runId) {
        var band = series[runId];
        state.index[runId] = [traces.length, traces.length + 1, traces.length + 2];
        state.lastX[runId] = band.x.length ? band.x[band.x.length - 1] : -Infinity;
        state.count += 3;
        Array.prototype.push.apply(traces, runTraces(field, runId, band));
      });
      charts[field] = state;
      var extra = { title: { text: plain(meta.label), font: { size: 14 }, x: 0.01 } };
      if (!traces.length) {
        extra.annotations = [{ text: "no telemetry yet", showarrow: false, xref: "paper", yref: "paper",
          x: 0.5, y: 0.5, font: { color: "#888" } }];
      }
      Plotly.newPlot(el, traces, layout(axisTitle(meta), extra), PLOT_CONFIG);
    });
    showEstimatedNote();
  }

  function showEstimatedNote() {
    if (!anyEstimated) { return; }
    Array.prototype.forEach.call(document.querySelectorAll(".est-note"), function (n) { n.hidden = false; });
  }

  function appendTelemetry(update) {
    Object.keys(update.runs || {}).forEach(function (runId) {
      if (!tele.runs[runId]) { tele.runs[runId] = update.runs[runId]; }
      if (update.runs[runId].estimated) { tele.runs[runId].estimated = true; }
    });
    var newest = null;
    Object.keys(update.series || {}).forEach(function (field) {
      var state = charts[field];
      if (!state) { return; }
      Object.keys(update.series[field]).forEach(function (runId) {
        var band = update.series[field][runId];
        var last = state.lastX[runId] === undefined ? -Infinity : state.lastX[runId];
        var fresh = emptyBand();
        for (var i = 0; i < band.x.length; i++) {
          if (band.x[i] > last) {
            fresh.x.push(band.x[i]); fresh.y.push(band.y[i]); fresh.lo.push(band.lo[i]); fresh.hi.push(band.hi[i]);
          }
        }
        if (!fresh.x.length) { return; }
        state.lastX[runId] = fresh.x[fresh.x.length - 1];
        newest = Math.max(newest || 0, state.lastX[runId]);
        if (state.index[runId] === undefined) {
          if (state.count === 0) { Plotly.relayout(state.el, { annotations: [] }); }
          state.index[runId] = [state.count, state.count + 1, state.count + 2];
          state.count += 3;
          Plotly.addTraces(state.el, runTraces(field, runId, fresh));
        } else {
          Plotly.extendTraces(state.el, { x: [fresh.x, fresh.x, fresh.x], y: [fresh.lo, fresh.hi, fresh.y] },
            state.index[runId], MAX_POINTS);
        }
      });
    });
    showEstimatedNote();
    return newest;
  }

  // ---------------------------------------------------------------- attribution
  function drawAttribution(attr) {
    var devEl = document.getElementById("chart-deviation");
    var wEl = document.getElementById("chart-weights");
    if (!devEl || !wEl || !attr) { return; }
    var traces = [];
    Object.keys(attr.deviation).forEach(function (armId) {
      var arm = cfg.arms[armId] || { name: "arm " + armId, color: "#555" };
      var d = attr.deviation[armId];
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
      traces.push({
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
    if (!Object.keys(attr.deviation).some(function (k) { return attr.deviation[k].x.length; })) {
      annotations.push({ text: "no attribution window yet", showarrow: false, xref: "paper", yref: "paper",
        x: 0.5, y: 0.5, font: { color: "#888" } });
    }
    Plotly.react(devEl, traces, layout("deviation vs control (%)", {
      shapes: shapes, annotations: annotations, yaxis: { title: { text: "deviation vs control (%)" }, zeroline: true },
      title: { text: "Deviation timeline", font: { size: 14 }, x: 0.01 }
    }), PLOT_CONFIG);

    var wTraces = Object.keys(attr.weights).map(function (armId) {
      var arm = cfg.arms[armId] || { name: "arm " + armId, color: "#555" };
      var w = attr.weights[armId];
      return { x: w.x, y: w.y, type: "scatter", mode: "lines", name: plain(arm.name),
        line: { shape: "hv", color: arm.color, width: 2 } };
    });
    Plotly.react(wEl, wTraces, layout("traffic weight (relative)", {
      title: { text: "Weights over time", font: { size: 14 }, x: 0.01 }
    }), PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- a run's cost breakdown
  function drawCost(cost) {
    var usedEl = document.getElementById("chart-used-idle");
    var resEl = document.getElementById("chart-resources");
    if (!cost || !usedEl || !resEl) { return; }
    var small = { height: 220, margin: { l: 100, r: 16, t: 30, b: 40 }, showlegend: false,
      xaxis: { title: { text: "USD" }, rangemode: "tozero", tickformat: "~r" }, yaxis: { automargin: true } };
    Plotly.newPlot(usedEl, [{ type: "bar", orientation: "h", y: ["used", "idle"],
      x: [cost.used_idle.used, cost.used_idle.idle], marker: { color: ["#1f6fb4", "#bbb"] },
      hovertemplate: "%{y}: %{x:.4g} USD<extra></extra>" }],
    Object.assign({ title: { text: "Used vs idle", font: { size: 14 }, x: 0.01 } }, small), PLOT_CONFIG);
    var names = Object.keys(cost.resources);
    var labels = names.map(function (n) { return n === "energy" && cost.energy_estimated ? "energy (est.)" : n; });
    Plotly.newPlot(resEl, [{ type: "bar", orientation: "h", y: labels,
      x: names.map(function (n) { return cost.resources[n]; }), marker: { color: "#2a9d5c" },
      hovertemplate: "%{y}: %{x:.4g} USD<extra></extra>" }],
    Object.assign({ title: { text: "Energy vs device-hours and the rest", font: { size: 14 }, x: 0.01 } }, small),
    PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- live polling
  var cursor = cfg.cursor;
  var attributionVersion = cfg.attribution ? cfg.attribution.version : "";
  var inFlight = false;
  var lastTableRefresh = Date.now();
  var lastSample = null;
  var timer = null;

  function refreshComparison() {
    var url = root.dataset.comparisonUrl;
    var target = document.getElementById("comparison-fragment");
    if (!url || !target) { return; }
    lastTableRefresh = Date.now();
    fetch(url, { credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html !== null) { target.innerHTML = html; } // server-rendered, escaped by the template engine
    }).catch(function () { /* the next poll retries */ });
  }

  function poll() {
    if (inFlight || document.hidden) { return; }
    inFlight = true;
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
      if (update.attribution) {
        attributionVersion = update.attribution.version;
        drawAttribution(update.attribution);
        refreshComparison();
      } else if (update.active && Date.now() - lastTableRefresh > 10000) {
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
    }).then(function () { inFlight = false; });
  }

  drawTelemetry();
  if (cfg.attribution) { drawAttribution(cfg.attribution); }
  if (cfg.cost) { drawCost(cfg.cost); }
  if (root.dataset.liveUrl) {
    timer = window.setInterval(poll, cfg.poll_ms || 1000);
    poll();
  } else {
    setStatus("");
  }
})();
