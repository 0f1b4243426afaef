// spasm view: the little JavaScript the pages need. Text from the run is only ever put into
// the page with textContent; HTML comes only from the viewer's own (escaped) fragments.
"use strict";
(function () {
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const KEY = "spasm.annotator";

  // -- the annotator name, remembered in this browser (and sent as a cookie for list filters)
  function setCookie(name) {
    document.cookie = "spasm_annotator=" + encodeURIComponent(name) + "; path=/; SameSite=Strict";
  }
  const who = $("#annotator");
  const remembered = localStorage.getItem(KEY) || "";
  if (remembered) setCookie(remembered);
  if (who) {
    who.value = remembered;
    who.addEventListener("change", () => {
      const name = who.value.trim();
      localStorage.setItem(KEY, name);
      setCookie(name);
      prefill();
    });
  }
  const annotator = () => (who ? who.value.trim() : "");

  // -- list filters: drop empty fields from the URL, apply selects at once
  const filters = $("#filters");
  if (filters) {
    filters.addEventListener("submit", () => {
      $$("input, select", filters).forEach((el) => {
        if (!el.value || el.value === el.dataset.default) el.disabled = true;
      });
    });
    $$("select", filters).forEach((el) => el.addEventListener("change", () => filters.requestSubmit()));
  }

  // -- compare page: choose harness levels
  const levels = $("#apply-levels");
  if (levels) {
    levels.addEventListener("click", () => {
      const chosen = $$("input[data-level]").filter((c) => c.checked).map((c) => c.value);
      location.search = chosen.length ? "?levels=" + encodeURIComponent(chosen.join(",")) : "";
    });
  }

  // -- "what the agent saw": load the server-rendered fragment once, then toggle it
  $$("button.seen-btn").forEach((button) => {
    button.addEventListener("click", async () => {
      const panel = document.getElementById(button.dataset.panel);
      if (!panel.hidden) { panel.hidden = true; return; }
      if (!panel.dataset.loaded) {
        const response = await fetch(button.dataset.url, { credentials: "same-origin" });
        panel.innerHTML = await response.text();
        panel.dataset.loaded = "1";
      }
      panel.hidden = false;
    });
  });

  // -- labels
  const form = $("#label-form");
  const status = $("#label-status");
  function say(text, ok) {
    if (!status) return;
    status.textContent = text;
    status.className = ok ? "ok" : "bad";
  }
  function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }
  function showLabels(data) {
    const body = $("#labels-table tbody");
    body.replaceChildren();
    for (const l of data.labels) {
      const tr = document.createElement("tr");
      tr.dataset.annotator = l.annotator;
      const flip = l.role_flip === true ? "yes" : l.role_flip === false ? "no" : "–";
      const when = l.labelled_at ? l.labelled_at.replace("T", " ").slice(0, 19) : "";
      [l.annotator, l.echoing || "–", flip, l.note || "", when].forEach((t) => tr.appendChild(cell(t)));
      body.appendChild(tr);
    }
    const history = $("#labels-history");
    if (history) history.textContent = data.history + " label" + (data.history === 1 ? "" : "s") +
      " in total (earlier ones are kept, the latest per annotator counts).";
  }
  // The form starts from this annotator's latest label, unless they already changed it.
  let dirty = false;
  async function prefill() {
    if (!form) return;
    const response = await fetch("/api/labels/" + encodeURIComponent(form.dataset.dialogue), { credentials: "same-origin" });
    if (!response.ok) return;
    const data = await response.json();
    showLabels(data);
    const current = data.labels.find((l) => l.annotator === annotator()) || null;
    if (!dirty) {
      $$("input[name=echoing]", form).forEach((r) => { r.checked = current !== null && r.value === current.echoing; });
      $("#role-flip").checked = current !== null && current.role_flip === true;
      $("#note").value = current && current.note ? current.note : "";
    }
    form.dataset.ready = "1";
  }
  async function save() {
    const name = annotator();
    if (!name) { say("Type your name in the Annotator box first.", false); if (who) who.focus(); return false; }
    const chosen = $$("input[name=echoing]", form).find((r) => r.checked);
    const body = {
      dialogue_id: form.dataset.dialogue, annotator: name,
      echoing: chosen ? chosen.value : null, role_flip: $("#role-flip").checked, note: $("#note").value,
    };
    const response = await fetch("/api/labels", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const data = await response.json();
    if (!response.ok) { say(data.error || "not saved", false); return false; }
    showLabels(data);
    say("saved as " + name, true);
    return true;
  }
  if (form) {
    form.addEventListener("input", () => { dirty = true; });
    form.addEventListener("submit", (e) => { e.preventDefault(); save(); });
    $("#save-next").addEventListener("click", async () => {
      if (await save() && form.dataset.next) location.href = form.dataset.next;
    });
    prefill();
  }

  // -- keyboard
  const help = $("#help");
  document.addEventListener("keydown", async (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const typing = e.target.closest && e.target.closest("input, textarea, select");
    if (typing) {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    const go = (id) => {
      const a = document.getElementById(id);
      if (a) location.href = a.href;
      return Boolean(a);
    };
    const key = e.key;
    if (key === "?") { help.hidden = !help.hidden; return; }
    if (key === "/" && $("#search")) { e.preventDefault(); $("#search").focus(); return; }
    if (key === "j" || key === "ArrowRight") { go("next-link") || go("next-page"); return; }
    if (key === "k" || key === "ArrowLeft") { go("prev-link") || go("prev-page"); return; }
    if (!form) return;
    const labels = { "1": "none", "2": "client", "3": "responder", "4": "both" };
    if (labels[key]) {
      const radio = $$("input[name=echoing]", form).find((r) => r.value === labels[key]);
      radio.checked = true;
      dirty = true;
      say("", true);
    } else if (key === "f") {
      const flip = $("#role-flip"); flip.checked = !flip.checked;
      dirty = true;
    } else if (key === "n") {
      e.preventDefault(); $("#note").focus();
    } else if (key === "s") {
      e.preventDefault(); await save();
    } else if (key === "Enter") {
      e.preventDefault();
      if (await save() && form.dataset.next) location.href = form.dataset.next;
    }
  });
})();
