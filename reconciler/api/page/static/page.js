// The status page's live part (#live): asked for each second and replaced when its ETag changed, without a reload.
// Without JavaScript the page reloads itself every five seconds instead (its <noscript> refresh). No inline script
// anywhere: the page's Content-Security-Policy allows this file alone.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) {
    return;
  }
  var url = live.getAttribute("data-live");
  var etag = live.getAttribute("data-etag") || "";
  var waiting = false;
  // The flash of an action (a switch set, an apply running) goes once the change converged: when the verdict turns
  // converged after it was not. An error's flash stays until the page is left.
  function verdictNow() {
    var header = document.getElementById("verdict");
    return header ? header.getAttribute("data-verdict") : "";
  }
  var was = verdictNow();
  function settle() {
    var now = verdictNow();
    var flash = document.getElementById("flash");
    if (flash && !flash.classList.contains("error") && was !== "converged" && now === "converged") {
      flash.parentNode.removeChild(flash);
    }
    was = now;
  }
  function tick() {
    if (waiting) {
      return;
    }
    waiting = true;
    var headers = etag ? { "If-None-Match": '"' + etag + '"' } : {};
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: headers })
      .then(function (r) {
        if (r.status === 401) {
          window.location.assign("/page/login");
          return null;
        }
        if (r.status !== 200) {
          return null;
        }
        var tag = (r.headers.get("ETag") || "").replace(/"/g, "");
        return r.text().then(function (text) {
          etag = tag;
          live.setAttribute("data-etag", tag);
          live.innerHTML = text;
          settle();
        });
      })
      .catch(function () {
        // The listener restarting: the next tick asks again.
      })
      .then(function () {
        waiting = false;
      });
  }
  window.setInterval(tick, 1000);
})();
