/* costlab charts, drawn after the page is up. The verdict, the facts and the tables are server-rendered
 * HTML, usable at once; plotly.js (1 MB) is compiled and run only after the load event (the page's
 * <link rel="prefetch"> downloads it meanwhile without holding that event back), then each
 * chart is drawn in a task of its own, those in view first, so the main thread is never blocked for
 * all of them at once: between two charts the browser paints and handles input. Static file, no
 * inline code (CSP): plotly's address comes from this script's data-plotly attribute.
 *
 *   costlabLazy.draw(el, fn)   queue fn (which calls Plotly on el) to run once plotly.js is ready.
 *
 * Performance marks (bench/dashboard.py): "costlab:first-chart" when the first chart is drawn (one in
 * view if any is), "costlab:charts-drawn" when the queue has drained. */
window.costlabLazy = (function () {
  "use strict";
  var me = document.currentScript;
  var src = me && me.dataset.plotly;
  var pending = []; // [{el, fn}] in the order the page asked
  var inView = typeof WeakSet === "function" ? new WeakSet() : null;
  var observer = null;
  var state = "waiting"; // waiting (for the load event) -> loading (plotly.js) -> ready
  var running = false; // a chain of draws is under way

  function mark(name) {
    if (window.performance && performance.mark && !performance.getEntriesByName(name).length) {
      performance.mark(name);
    }
  }

  if (window.IntersectionObserver && inView) {
    // Charts on screen (or about to be) are drawn before the others.
    observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { inView.add(e.target); } else { inView.delete(e.target); }
      });
    }, { rootMargin: "200px 0px" });
  }

  function next() {
    for (var i = 0; i < pending.length; i++) {
      if (inView && inView.has(pending[i].el)) { return pending.splice(i, 1)[0]; }
    }
    return pending.shift();
  }

  function pump() {
    var job = next();
    running = Boolean(job);
    if (!job) { mark("costlab:charts-drawn"); return; }
    if (observer) { observer.unobserve(job.el); }
    // The next chart in a task of its own (a paint or an input may come first), even if this one throws
    // (an error a page's tests see, uncaught).
    window.setTimeout(pump, 0);
    job.fn();
    mark("costlab:first-chart");
  }

  function loadPlotly() {
    if (!pending.length) { state = "ready"; mark("costlab:charts-drawn"); return; }
    if (window.Plotly) { state = "ready"; pump(); return; }  // already there (another script loaded it)
    state = "loading";
    var s = document.createElement("script");
    s.src = src;
    s.onload = function () { state = "ready"; pump(); };
    s.onerror = function () { if (window.console) { console.error("plotly.js did not load: " + src); } };
    document.head.appendChild(s);
  }

  if (document.readyState === "complete") { window.setTimeout(loadPlotly, 0); }
  else { window.addEventListener("load", function () { window.setTimeout(loadPlotly, 0); }); }

  return {
    draw: function (el, fn) {
      pending.push({ el: el, fn: fn });
      if (observer) { observer.observe(el); }
      if (state === "ready" && !running) { pump(); }
    }
  };
})();
