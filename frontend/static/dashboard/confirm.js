/* A form with data-confirm="..." asks before it is sent: cancelling runs, say. With scripts off
 * the form is sent as it is (the server still checks every request). */
document.addEventListener("submit", function (event) {
  "use strict";
  var form = event.target;
  var question = form && form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
}, true);
