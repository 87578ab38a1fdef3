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
