// The one script of pgqctl's page: an element with data-events is replaced
// by each fragment the server sends on that stream of server-sent events.
// The fragments are made by the server's templates, which escape every value
// read from the database. EventSource reconnects by itself when the stream drops.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-events]").forEach(function (element) {
    var source = new EventSource(element.dataset.events);
    source.onmessage = function (event) {
      element.innerHTML = event.data;
      element.dataset.updated = String(Date.now());
    };
  });
});
