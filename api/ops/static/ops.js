// The ops page's only script: re-fetch the server-rendered panel every few seconds, and send the buttons'
// POSTs without leaving the page. Nothing else is loaded; the page works without it (forms, meta refresh).
"use strict";

(() => {
  const panel = document.getElementById("panel");
  const status = document.getElementById("status");
  const flash = document.getElementById("flash");
  const every = Number(panel.dataset.refreshMs) || 2000;
  let busy = false;

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(panel.dataset.src, { cache: "no-store", headers: { Accept: "text/html" } });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      panel.innerHTML = await response.text();
      panel.dataset.version = String(Number(panel.dataset.version || 0) + 1); // tests wait on it
      status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      status.classList.remove("stale");
    } catch (error) {
      status.textContent = `refresh failed (${error.message}); retrying`;
      status.classList.add("stale");
    } finally {
      busy = false;
    }
  }

  function say(message, bad) {
    flash.textContent = message;
    flash.classList.toggle("bad", bad);
    flash.hidden = false;
  }

  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("action")) return;
    event.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    try {
      const response = await fetch(form.action, { method: "POST", headers: { Accept: "application/json" } });
      const body = await response.json().catch(() => ({}));
      if (response.ok) say(body.message || "done", false);
      else say((body.error && body.error.message) || `${response.status} ${response.statusText}`, true);
    } catch (error) {
      say(`request failed: ${error.message}`, true);
    }
    refresh();
  });

  document.addEventListener("visibilitychange", refresh);
  setInterval(refresh, every);
})();
