// spasm view's play pages. Every utterance arrives as JSON and goes into the page with
// textContent only: markup a person or a model typed is shown, never run.
"use strict";
(function () {
  const $ = (sel) => document.querySelector(sel);
  const meta = $('meta[name="spasm-csrf"]');
  const csrf = meta ? meta.getAttribute("content") : "";

  async function post(url, data) {
    const res = await fetch(url, {
      method: "POST", headers: {"Content-Type": "application/json", "X-Spasm-CSRF": csrf},
      body: JSON.stringify(data), credentials: "same-origin",
    });
    let body = {};
    try { body = await res.json(); } catch (e) { body = {error: res.statusText}; }
    return {ok: res.ok, status: res.status, body: body};
  }

  // -- /play: start a session
  const form = $("#play-new");
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const data = {};
      new FormData(form).forEach((v, k) => { data[k] = String(v); });
      const r = await post("/api/play", data);
      if (r.ok) { window.location.href = r.body.url; } else { $("#play-error").textContent = r.body.error || "failed"; }
    });
  }

  // -- /play/fork/<dialogue>/<turn>: take a seat from a turn of a dialogue
  const fork = $("#play-fork");
  if (fork) {
    fork.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const r = await post("/api/play", {
        operator: String(new FormData(fork).get("operator") || ""),
        fork: {dialogue_id: fork.dataset.dialogue, turn: Number(fork.dataset.turn)},
      });
      if (r.ok) { window.location.href = r.body.url; } else { $("#play-error").textContent = r.body.error || "failed"; }
    });
  }

  // -- /play/<id>: the conversation
  const box = $("#play");
  if (!box) return;
  const sid = box.dataset.sid;
  const log = $("#play-log"), status = $("#play-status"), text = $("#play-text");
  const send = $("#play-send"), err = $("#play-error");
  let turn = null, shownAt = 0, edits = 0, pasted = 0, last = "";

  text.addEventListener("beforeinput", (ev) => {
    if (ev.inputType && ev.inputType.startsWith("delete")) edits += 1;
  });
  text.addEventListener("paste", (ev) => {
    const t = ev.clipboardData ? ev.clipboardData.getData("text") : "";
    pasted += t.length;
  });
  text.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#play-say").requestSubmit(); }
  });

  function render(state) {
    $("#play-frame").textContent = state.frame || "";
    const key = JSON.stringify([state.messages, state.status]);
    if (key !== last) {
      last = key;
      log.replaceChildren();
      for (const m of state.messages) {
        const li = document.createElement("li");
        li.className = m.side;
        const who = document.createElement("span");
        who.className = "who";
        who.textContent = m.who;
        const body = document.createElement("span");
        body.className = "text";
        body.textContent = m.text;
        li.append(who, body);
        log.append(li);
      }
    }
    status.dataset.status = state.status;
    const mine = state.status === "your_turn";
    const debrief = $("#play-debrief");
    debrief.hidden = state.status !== "debrief";
    $("#play-goal-box").hidden = !state.goal;
    $("#play-goal").textContent = state.goal || "";
    status.textContent = {
      starting: "Starting…", your_turn: "Your turn.", thinking: "The other side is thinking",
      debrief: "The conversation has ended (" + state.detail + "). Two questions before it is saved:",
      ended: "The conversation has ended: " + state.detail,
      failed: "The session failed: " + state.detail,
    }[state.status] || state.status;
    if (mine && turn !== state.turn) {
      turn = state.turn; shownAt = performance.now(); edits = 0; pasted = 0;
    }
    text.disabled = !mine; send.disabled = !mine;
    $("#play-end").disabled = state.status === "ended" || state.status === "failed";
    if (mine && document.activeElement !== text) text.focus();
  }

  async function poll() {
    try {
      const res = await fetch("/api/play/" + encodeURIComponent(sid), {credentials: "same-origin"});
      if (res.ok) render(await res.json());
    } catch (e) { /* the server is away (a restart): try again */ }
  }

  $("#play-say").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const value = text.value.trim();
    if (!value || turn === null) return;
    send.disabled = true;
    const r = await post("/api/play/" + encodeURIComponent(sid) + "/say", {
      turn: turn, text: value, typing_ms: Math.round(performance.now() - shownAt),
      edits: edits, pasted_chars: pasted,
    });
    if (r.ok) { text.value = ""; err.textContent = ""; render(r.body); }
    else { err.textContent = r.body.error || "not sent"; poll(); }
  });
  $("#play-debrief").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData($("#play-debrief"));
    const met = f.get("goal_met");
    const rating = f.get("rating");
    const r = await post("/api/play/" + encodeURIComponent(sid) + "/debrief", {
      goal_met: met === "yes" ? true : met === "no" ? false : null,
      rating: rating ? Number(rating) : null,
    });
    if (r.ok) render(r.body); else err.textContent = r.body.error || "not saved";
  });
  $("#play-end").addEventListener("click", async () => {
    const r = await post("/api/play/" + encodeURIComponent(sid) + "/end", {});
    if (r.ok) render(r.body); else err.textContent = r.body.error || "failed";
  });
  poll();
  setInterval(poll, 700);
})();
