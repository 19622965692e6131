/* costlab spend: per team, cumulative spend of each experiment and arm over the month (stacked
 * areas) against the monthly budget (a dashed line). Static file; data from #spend-data. Each chart is
 * queued with costlabLazy.draw (lazy.js): drawn once plotly.js is there, after the load event. */
(function () {
  "use strict";

  var dataEl = document.getElementById("spend-data");
  if (!dataEl || !window.costlabLazy || !window.costlabPlain) { return; }
  var data = JSON.parse(dataEl.textContent);
  Array.prototype.forEach.call(document.querySelectorAll(".spend-chart"), function (el) {
    var chart = data[el.dataset.tenant];
    if (!chart || !chart.traces.length) { return; }
    window.costlabLazy.draw(el, function () { draw(el, chart); });
  });

  function draw(el, chart) {
    var traces = chart.traces.map(function (t) {
      return { type: "scatter", mode: "lines", stackgroup: "spend", name: window.costlabPlain(t.name), x: t.x, y: t.y,
               line: { color: t.color, width: 1.5 }, hovertemplate: "%{y:.4f} USD<extra>%{fullData.name}</extra>" };
    });
    var top = 0;
    chart.traces.forEach(function (t) { top += t.y.length ? t.y[t.y.length - 1] : 0; });
    var annotations = [];
    // A budget far above the spend would flatten every line to the axis: say it instead of drawing it.
    if (top >= 0.2 * chart.budget_usd) {
      traces.push({ type: "scatter", mode: "lines", name: "monthly budget", x: chart.x_range,
                    y: [chart.budget_usd, chart.budget_usd], line: { color: "#c0392b", dash: "dash", width: 1.5 },
                    hovertemplate: "budget %{y:.2f} USD<extra></extra>" });
    } else {
      annotations.push({ xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right", showarrow: false,
                         text: "monthly budget " + chart.budget_usd.toLocaleString("en-US") +
                               " USD: above this scale", font: { color: "#c0392b", size: 12 } });
    }
    window.Plotly.newPlot(el, traces, {
      annotations: annotations,
      height: 320, margin: { l: 64, r: 16, t: 12, b: 40 }, hovermode: "x unified",
      xaxis: { type: "date", range: chart.x_range, title: { text: "day (UTC)" } },
      yaxis: { title: { text: "cumulative spend (USD)" }, rangemode: "tozero" },
      legend: { orientation: "h", y: -0.2 }
    }, { displaylogo: false, responsive: true });
  }
})();
