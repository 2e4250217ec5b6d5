// The dashboard's only script: the live status, and new mail from /events added to the
// inbox. Another agent's words go into the page as text (textContent), never as HTML.
"use strict";
(function () {
  const status = document.getElementById("live");
  const setStatus = (state, text) => {
    document.body.dataset.live = state;
    if (status) status.textContent = text;
  };
  const byData = (selector, key, value) =>
    Array.from(document.querySelectorAll(selector)).find((el) => el.dataset[key] === value);
  const span = (className, text) => {
    const el = document.createElement("span");
    el.className = className;
    el.textContent = text;
    return el;
  };

  const source = new EventSource("/events");
  let lost = false;
  source.addEventListener("open", () => {
    // Mail may have come while the stream was down: the page reads the store again.
    if (lost) {
      location.reload();
      return;
    }
    setStatus("connected", "live");
  });
  source.addEventListener("error", () => {
    lost = true;
    setStatus("reconnecting", "live: reconnecting");
  });
  source.addEventListener("reload", () => location.reload());
  source.addEventListener("mail", (event) => {
    let mail;
    try {
      mail = JSON.parse(event.data);
    } catch {
      return;
    }
    const list = byData("ul[data-inbox]", "inbox", mail.agent);
    if (list && !byData("li[data-id]", "id", mail.id)) {
      const item = document.createElement("li");
      item.className = "unread fresh";
      item.dataset.id = mail.id;
      const link = document.createElement("a");
      link.href =
        "/agents/" + encodeURIComponent(mail.agent) + "/messages/" + encodeURIComponent(mail.id);
      link.textContent = mail.subject || "(no subject)";
      item.append(link, " ", span("from", "from " + mail.from), " ", span("muted", mail.sent_at));
      for (const mark of mail.marks || []) item.append(" ", span(mark.class, mark.text));
      list.prepend(item);
      const empty = document.getElementById("inbox-empty");
      if (empty) empty.remove();
    }
    for (const key of ["unread", "total"]) {
      for (const count of document.querySelectorAll("[data-" + key + "]")) {
        if (count.dataset[key] !== mail.agent) continue;
        count.textContent = String((parseInt(count.textContent, 10) || 0) + 1);
      }
    }
  });
})();
