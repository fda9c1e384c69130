// The inbox reloads itself when an escalation opens or is decided (on any replica).
// Without JavaScript a <noscript> refresh does the same every 30 seconds.
(function () {
  "use strict";
  var inbox = document.getElementById("inbox");
  if (!inbox) { return; }
  var seen = inbox.getAttribute("data-stamp");
  var url = inbox.getAttribute("data-stamp-url");
  var every = 3000;

  function check() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) {
        if (body && body.stamp && body.stamp !== seen) {
          var note = document.getElementById("refreshed");
          if (note) { note.hidden = false; }
          window.location.reload();
          return;
        }
        window.setTimeout(check, every);
      })
      .catch(function () { window.setTimeout(check, every * 4); });
  }
  window.setTimeout(check, every);
}());
