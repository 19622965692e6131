/* costlab authoring: the strategy editor checks its YAML as you type through the API's
 * POST /api/v1/arms/validate/ (the same check a save makes) and names each bad key; the
 * example picker fills an arm's editor with one of the runtime's example strategies.
 * A static file: no inline scripts or handlers (the page's CSP allows none). */
(function () {
  "use strict";

  var form = document.querySelector("form[data-validate-url]");  // an experiment's or a sweep's form
  if (!form) { return; }
  var examplesEl = document.getElementById("strategy-examples");
  var examples = examplesEl ? JSON.parse(examplesEl.textContent) : {};
  var csrf = form.querySelector("input[name=csrfmiddlewaretoken]");
  var DEBOUNCE_MS = 350;

  function tenantSlug() {
    var select = document.getElementById("id_tenant");
    return select ? select.value : (form.dataset.tenant || "");
  }

  function statusFor(textarea) {
    return form.querySelector('[data-status-for="' + textarea.id + '"]');
  }

  function show(el, cls, lines) {
    el.className = "strategy-status small " + cls;
    el.textContent = "";
    lines.forEach(function (line, i) {
      if (i) { el.appendChild(document.createElement("br")); }
      el.appendChild(document.createTextNode(line));
    });
  }

  // The last save's errors under this strategy: they are about the text that was saved.
  function clearSavedErrors(textarea) {
    var box = textarea.closest("fieldset.arm-form") || textarea.closest(".field");
    if (!box) { return; }
    Array.prototype.forEach.call(box.querySelectorAll(
      '.error[data-error-for="strategy_yaml"], .error[data-error-for="base_strategy_yaml"]'), function (e) {
      e.remove();
    });
    if (!box.querySelector(".error")) { box.classList.remove("has-error"); }
  }

  function validate(textarea) {
    var el = statusFor(textarea);
    if (!el) { return; }
    var text = textarea.value;
    if (!text.trim()) { show(el, "muted", ["empty: fill in a strategy or start from an example"]); return; }
    var seq = (textarea._seq || 0) + 1;
    textarea._seq = seq;
    show(el, "muted", ["checking…"]);
    var headers = { "Content-Type": "application/json", "Accept": "application/json",
                    "X-CSRFToken": csrf ? csrf.value : "" };
    if (tenantSlug()) { headers["X-Costlab-Tenant"] = tenantSlug(); }
    fetch(form.dataset.validateUrl, {
      method: "POST", credentials: "same-origin", headers: headers,
      body: JSON.stringify({ strategy_yaml: text })
    }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (res) {
      if (seq !== textarea._seq) { return; } // a newer check is on its way
      if (res.ok && res.body.valid) {
        show(el, "valid", ["✓ valid strategy · sha256 " + res.body.strategy_sha256.slice(0, 12) + "…"]);
        textarea.setAttribute("aria-invalid", "false");
        return;
      }
      var error = res.body.error || {};
      var fields = error.fields || {};
      var lines = fields.strategy_yaml || [error.message || "not a valid strategy"];
      show(el, "invalid", lines.map(function (l) { return "✗ " + l; }));
      textarea.setAttribute("aria-invalid", "true");
    }).catch(function () {
      if (seq === textarea._seq) { show(el, "muted", ["could not check now; saving checks it again"]); }
    });
  }

  Array.prototype.forEach.call(form.querySelectorAll("textarea[data-strategy-editor]"), function (textarea) {
    var timer = null;
    textarea.addEventListener("input", function () {
      clearSavedErrors(textarea);  // edited since the save: the live check below says what holds now
      window.clearTimeout(timer);
      timer = window.setTimeout(function () { validate(textarea); }, DEBOUNCE_MS);
    });
    if (textarea.value.trim()) { validate(textarea); }
  });

  Array.prototype.forEach.call(form.querySelectorAll("select.example-picker"), function (select) {
    select.addEventListener("change", function () {
      var textarea = document.getElementById(select.dataset.target);
      if (!textarea || !examples[select.value]) { return; }
      textarea.value = examples[select.value];
      clearSavedErrors(textarea);
      validate(textarea);
    });
  });
})();
