/* costlab spend: per team, cumulative spend of each experiment and arm over the month (stacked
 * areas) against the monthly budget (a dashed line). Static file; data from #spend-data. Each chart is
 * queued with costlabLazy.draw (lazy.js): drawn once plotly.js is there, after the load event. Its legend
 * is HTML under it (legend.js): "experiment / arm" names are long, and wrap there instead of being cut. */
(function () {
  "use strict";

  var dataEl = document.getElementById("spend-data");
  if (!dataEl || !window.costlabLazy || !window.costlabPlain || !window.costlabLegend) { return; }
  var data = JSON.parse(dataEl.textContent);
  Array.prototype.forEach.call(document.querySelectorAll(".spend-chart"), function (el) {
    var chart = data[el.dataset.tenant];
    if (!chart || !chart.traces.length) { return; }
    window.costlabLazy.draw(el, function () { draw(el, chart); });
  });

  function draw(el, chart) {
    var box = document.createElement("div");
    el.parentNode.insertBefore(box, el.nextSibling);
    var legend = window.costlabLegend(box, function () { return [el]; });
    var entries = [];
    var traces = chart.traces.map(function (t, i) {
      entries.push({ group: "arm-" + i, name: t.name, color: t.color });
      return { type: "scatter", mode: "lines", stackgroup: "spend", name: window.costlabPlain(t.name), x: t.x, y: t.y,
               legendgroup: "arm-" + i, line: { color: t.color, width: 1.5 },
               hovertemplate: "%{y:.4f} USD<extra>%{fullData.name}</extra>" };
    });
    var top = 0;
    chart.traces.forEach(function (t) { top += t.y.length ? t.y[t.y.length - 1] : 0; });
    var annotations = [];
    // A budget far above the spend would flatten every line to the axis: say it instead of drawing it.
    if (top >= 0.2 * chart.budget_usd) {
      entries.push({ group: "budget", name: "monthly budget", color: "#c0392b", dash: "dash" });
      traces.push({ type: "scatter", mode: "lines", name: "monthly budget", legendgroup: "budget", x: chart.x_range,
                    y: [chart.budget_usd, chart.budget_usd], line: { color: "#c0392b", dash: "dash", width: 1.5 },
                    hovertemplate: "budget %{y:.2f} USD<extra></extra>" });
    } else {
      annotations.push({ xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right", showarrow: false,
                         text: "monthly budget " + chart.budget_usd.toLocaleString("en-US") +
                               " USD: above this scale", font: { color: "#c0392b", size: 12 } });
    }
    legend.set(entries);
    window.Plotly.newPlot(el, traces, {
      annotations: annotations, showlegend: false,
      height: 320, margin: { l: 8, r: 16, t: 24, b: 8 }, hovermode: "x unified",
      xaxis: { type: "date", range: chart.x_range, automargin: true, ticklabelstandoff: 6,
               title: { text: "day (UTC)", standoff: 6 } },
      yaxis: { title: { text: "cumulative spend (USD)", standoff: 8 }, rangemode: "tozero", automargin: true }
    }, { displaylogo: false, responsive: true });
  }
})();
