// leaseq dashboard: live updates without a page reload.
//
// The page names what it shows (<body data-live-view data-live-version>). An
// EventSource on /live (the dashboard session's cookie authenticates it) sends
// a "change" event when that changes; the page is then fetched again and each
// [data-live] region is replaced in place. Ticked checkboxes stay ticked, and a
// region whose text field has the focus is left alone until the next change.
// Without JavaScript the pages work as they are: reload to refresh.
(function () {
  "use strict";
  var body = document.body;
  var view = body.getAttribute("data-live-view");
  if (!view || !window.EventSource || !window.fetch) return;
  var version = body.getAttribute("data-live-version") || "";
  var source = null, busy = false, again = false;

  function liveUrl() {
    var params = new URLSearchParams(location.search);
    params.delete("msg"); params.delete("err");
    params.set("view", view);
    params.set("v", version);
    var id = body.getAttribute("data-live-id");
    if (id) params.set("id", id);
    return "/live?" + params.toString();
  }

  function editing(region) {
    var el = document.activeElement;
    return el && region.contains(el) && el.matches("input[type=text], textarea, select");
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live]").forEach(function (old) {
      var fresh = doc.getElementById(old.id);
      if (!fresh || editing(old)) return;
      var ticked = {};
      old.querySelectorAll("input[type=checkbox]:checked").forEach(function (c) { ticked[c.value] = true; });
      fresh.querySelectorAll("input[type=checkbox]").forEach(function (c) { if (ticked[c.value]) c.checked = true; });
      old.replaceWith(document.adoptNode(fresh));
    });
    var updated = doc.body.getAttribute("data-live-version");
    if (updated) { version = updated; body.setAttribute("data-live-version", updated); }
    body.setAttribute("data-live-updates", String(Number(body.getAttribute("data-live-updates") || 0) + 1));
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.pathname + location.search, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) {
        if (!r.ok || r.redirected) throw new Error("page answered " + r.status);
        return r.text();
      })
      .then(swap)
      .catch(function () { /* the next change tries again */ })
      .then(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  function connect() {
    source = new EventSource(liveUrl());
    source.addEventListener("change", refresh);
    // The server ends each stream after a while (and re-checks the session at
    // the next one); reconnect from the version the page shows now.
    source.addEventListener("reconnect", function () { source.close(); connect(); });
    source.addEventListener("end", function () { source.close(); });  // session over: stop
  }
  connect();
})();
