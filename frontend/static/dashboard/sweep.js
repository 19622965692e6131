// A sweep's scatter: measured probes, the frontier line, infeasible probes along the top; polled while running.
(function () {
  "use strict";
  var el = document.getElementById("sweep-chart");
  if (!el || !window.Plotly || !window.costlabPlain) return;
  var plain = window.costlabPlain; // labels from data are text, never markup (plain.js)

  function draw(data) {
    var ax = data.axes, done = data.probes.filter(function (p) { return p.x !== null && p.y !== null; });
    var front = done.filter(function (p) { return p.on_frontier; }).sort(function (a, b) { return a.x - b.x; });
    var bad = data.probes.filter(function (p) { return p.status === "infeasible"; });
    var xs = done.map(function (p) { return p.x; }), ys = done.map(function (p) { return p.y; });
    var xmin = xs.length ? Math.min.apply(null, xs) : 0, xmax = xs.length ? Math.max.apply(null, xs) : 1;
    var ytop = ys.length ? Math.max.apply(null, ys) * 1.1 : 1;
    function hover(p) { return "#" + p.number + " " + plain(p.strategy) + (p.reason ? "<br>" + plain(p.reason) : ""); }
    var traces = [
      {name: "probes", mode: "markers", type: "scatter", x: xs, y: ys, text: done.map(hover), hoverinfo: "text+x+y",
       marker: {size: 10, color: done.map(function (p) { return p.on_frontier ? "#2a9d5c" : "#1f6fb4"; })}},
      {name: "frontier", mode: "lines", type: "scatter", x: front.map(function (p) { return p.x; }),
       y: front.map(function (p) { return p.y; }), line: {color: "#2a9d5c", shape: "hv"}, hoverinfo: "skip"},
      {name: "infeasible", mode: "markers", type: "scatter", text: bad.map(hover), hoverinfo: "text",
       x: bad.map(function (p, i) { return xmin + (xmax - xmin) * (i + 1) / (bad.length + 1); }),
       y: bad.map(function () { return ytop; }), marker: {symbol: "x", size: 11, color: "#d1495b"}}
    ];
    var layout = {
      margin: {t: 20, r: 20}, xaxis: {title: {text: plain(ax[0].label)}}, yaxis: {title: {text: plain(ax[1].label)}},
      legend: {orientation: "h"}
    };
    if (!done.length) {
      // Nothing measured yet: say so in words, not bare axes around no point.
      var waiting = data.probes.length - bad.length;
      traces = [];
      layout.xaxis = {visible: false};
      layout.yaxis = {visible: false};
      layout.annotations = [{text: "no probe measured yet" + (waiting ? ": " + waiting + " queued or running" : "") +
        (bad.length ? (waiting ? ", " : ": ") + bad.length + " infeasible (see the table)" : ""),
        showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: {color: "#888", size: 13}}];
    }
    Plotly.react(el, traces, layout, {displaylogo: false, responsive: true});
  }

  var data = JSON.parse(document.getElementById("sweep-data").textContent);
  draw(data);
  var url = el.getAttribute("data-live-url");
  function poll() {
    fetch(url, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : null; }).then(function (next) {
      if (!next) return;
      draw(next);
      if (next.status !== data.status) { window.location.reload(); return; }  // the table and badge too
      if (next.probes.filter(function (p) { return p.status !== "queued" && p.status !== "running"; }).length !==
          data.probes.filter(function (p) { return p.status !== "queued" && p.status !== "running"; }).length) {
        window.location.reload();  // a probe landed: refresh the table
        return;
      }
      data = next;
      if (next.poll_ms) setTimeout(poll, next.poll_ms);
    });
  }
  if (data.poll_ms) setTimeout(poll, data.poll_ms);
})();
