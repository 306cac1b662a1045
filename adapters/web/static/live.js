// Live updates of a run's page: while the run is live, ask for its part of the page every
// few seconds and put the new one in place. No build step, no inline script (the page's
// Content-Security-Policy allows same-origin scripts only). The server escapes everything;
// this only moves its HTML into place.
(function () {
  "use strict";
  var timer = null;

  function root() {
    return document.getElementById("run");
  }

  function schedule(delay) {
    if (timer !== null) clearTimeout(timer);
    timer = setTimeout(poll, delay);
  }

  function openDetails(node) {
    var open = [];
    node.querySelectorAll("details[open][id]").forEach(function (d) { open.push(d.id); });
    return open;
  }

  function poll() {
    timer = null;
    var current = root();
    if (!current || !current.dataset.liveUrl) return;
    var url = current.dataset.liveUrl;
    var interval = parseInt(current.dataset.interval, 10) || 2000;
    var ask = url + (url.indexOf("?") < 0 ? "?" : "&") + "v=" + encodeURIComponent(current.dataset.version || "");
    fetch(ask, { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.status === 204) return null;
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var next = current;
        if (html !== null) {
          var parsed = new DOMParser().parseFromString(html, "text/html");
          var fresh = parsed.getElementById("run");
          if (fresh) {
            var open = openDetails(current);
            next = document.importNode(fresh, true);
            open.forEach(function (id) {
              var d = next.querySelector("details[id='" + id.replace(/[^A-Za-z0-9_-]/g, "") + "']");
              if (d) d.open = true;
            });
            current.replaceWith(next);
          }
        }
        if (next.dataset.liveUrl) schedule(parseInt(next.dataset.interval, 10) || interval);
      })
      .catch(function () { schedule(Math.min(interval * 3, 30000)); });
  }

  function start() {
    var current = root();
    if (current && current.dataset.liveUrl) {
      schedule(parseInt(current.dataset.interval, 10) || 2000);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
