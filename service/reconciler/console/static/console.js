// The inbox's lists refresh themselves when an escalation opens or is decided (on any
// replica): the page is fetched again and only its parts marked data-live replace
// these, so the filter form keeps what the operator is typing and choosing.
// Without JavaScript a <noscript> refresh reloads the whole page every 30 seconds.
(function () {
  "use strict";
  var inbox = document.getElementById("inbox");
  if (!inbox || !window.fetch || !window.DOMParser) { return; }
  var seen = inbox.getAttribute("data-stamp");
  var url = inbox.getAttribute("data-stamp-url");
  var note = document.getElementById("refreshed");
  var every = 3000;

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    if (!fresh.getElementById("inbox")) { return false; } // signed out: a sign-in page
    var parts = document.querySelectorAll("[data-live]");
    for (var i = 0; i < parts.length; i++) {
      var next = fresh.getElementById(parts[i].id);
      if (next) { parts[i].replaceWith(document.importNode(next, true)); }
    }
    return true;
  }

  function refresh(stamp) {
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null || !swap(html)) { window.location.reload(); return; }
        seen = stamp;
        inbox.setAttribute("data-stamp", stamp);
        if (note) {
          note.textContent = "Escalations changed: the lists were refreshed at " +
            new Date().toISOString().slice(11, 19) + " UTC.";
          note.hidden = false;
        }
      });
  }

  function check() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) {
        if (body && body.stamp && body.stamp !== seen) { return refresh(body.stamp); }
        return null;
      })
      .then(function () { window.setTimeout(check, every); })
      .catch(function () { window.setTimeout(check, every * 4); });
  }
  window.setTimeout(check, every);
}());
