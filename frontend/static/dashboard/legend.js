/* costlab chart legends, in HTML beside the charts, never inside them: a Plotly legend in the figure
 * covers the axis titles at a phone's width, and scrolls (or outgrows the plot) with a dozen runs. An
 * HTML legend wraps, and one legend can serve several charts (the runs of a page's telemetry).
 *
 *   var legend = costlabLegend(box, charts)   box: the element to fill; charts(): the chart elements
 *                                             it serves (drawn Plotly divs)
 *   legend.set(entries)       [{group, name, color, dash: "solid"|"dot"|"dash", symbol}]: one button
 *                             each; a trace belongs to the entry whose group is its legendgroup
 *   legend.visible(group)     what a new trace of that group sets as `visible`
 *   legend.apply(el)          show el's traces as the legend says (after drawing el)
 *
 * A click on an entry shows that group alone on every chart served; a second click shows them all.
 * Names are text (textContent), never markup. Static file, loaded before charts.js and spend.js. */
window.costlabLegend = function (box, charts) {
  "use strict";
  var alone = null;
  var DASH = { dot: "dotted", dash: "dashed" };
  box.classList.add("chart-legend");
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", "legend: a click shows that line alone, a second click shows all");

  function visible(group) { return alone === null || alone === group ? true : "legendonly"; }

  function apply(el) {
    if (!el.data || !el.data.length) { return; }
    var want = el.data.map(function (t) { return visible(t.legendgroup); });
    var have = el.data.map(function (t) { return t.visible === undefined ? true : t.visible; });
    if (want.join() !== have.join()) { window.Plotly.restyle(el, { visible: want }); }
  }

  function entryButton(entry) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "legend-entry";
    b.dataset.group = entry.group;
    b.setAttribute("aria-pressed", String(alone === entry.group));
    var mark = document.createElement("span");
    mark.className = entry.symbol ? "legend-mark legend-symbol" : "legend-mark";
    if (entry.symbol) {
      mark.textContent = entry.symbol;
      mark.style.color = entry.color;
    } else {
      mark.style.borderTopColor = entry.color;
      mark.style.borderTopStyle = DASH[entry.dash] || "solid";
    }
    var name = document.createElement("span");
    name.textContent = entry.name;
    b.appendChild(mark);
    b.appendChild(name);
    b.addEventListener("click", function () {
      alone = alone === entry.group ? null : entry.group;
      Array.prototype.forEach.call(box.querySelectorAll(".legend-entry"), function (other) {
        other.setAttribute("aria-pressed", String(alone === other.dataset.group));
        other.classList.toggle("legend-off", alone !== null && alone !== other.dataset.group);
      });
      charts().forEach(apply);
    });
    if (alone !== null && alone !== entry.group) { b.classList.add("legend-off"); }
    return b;
  }

  function set(entries) {
    // A group that is gone (a redraw without it) no longer hides the others.
    if (!entries.some(function (e) { return e.group === alone; })) { alone = null; }
    while (box.firstChild) { box.removeChild(box.firstChild); }
    entries.forEach(function (entry) { box.appendChild(entryButton(entry)); });
    box.hidden = !entries.length;
  }

  return { set: set, visible: visible, apply: apply };
};
