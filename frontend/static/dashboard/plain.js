/* Plotly renders a subset of HTML in trace names, hover text, annotations and titles (<a href>, <b> ...).
 * Every label that comes from data (arm names, run labels, reasons, strategies) goes through
 * costlabPlain() so Plotly shows it as text, never as markup: it decodes these entities back to
 * the characters, and never parses them as tags. Loaded before charts.js and sweep.js. */
window.costlabPlain = function (value) {
  "use strict";
  return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
};
