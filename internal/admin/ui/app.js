// delayd console: plain JavaScript, no dependencies, nothing loaded from
// the network but this daemon's own /ui/api endpoints.
"use strict";

const state = { csrf: "", actions: false, browseNext: "", browseQuery: null, deadNext: "" };
const $ = (sel) => document.querySelector(sel);
const READ_ONLY = "Read-only console: cancel, replay, purge, limits and pauses are off because ui.allow_actions is false in the daemon's config.";
// STATE_NOTES explain a state beside its name; a state the page does not
// know (a newer daemon's) shows by its name alone.
const STATE_NOTES = { paused: "parked by a pause of its target; goes out in due order after the resume" };
const stateText = (s) => (STATE_NOTES[s] ? `${s} (${STATE_NOTES[s]})` : String(s ?? ""));

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function api(path, opts = {}) {
  const res = await fetch("/ui/api/" + path, { credentials: "same-origin", ...opts });
  if (!res.ok) throw new Error((await res.text()).trim() || res.statusText);
  return res.json();
}

function post(path, body) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf }, body: JSON.stringify(body) });
}

function toast(msg) {
  const t = $("#toast");
  t.textContent = msg;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 4000);
}

// bars draws a bar chart into an <svg> from [{label, value}]. Axis labels
// sit centred under their bars, never rotated: one row when they fit,
// two staggered rows when each has room for two bars, else every k-th
// label. The first and last are anchored inside the chart so none is
// clipped.
function bars(svg, data) {
  const w = 360, h = 180, left = 28, right = 4, top = 14, charW = 6, rowH = 11;
  const n = Math.max(data.length, 1);
  const max = Math.max(1, ...data.map((d) => d.value));
  const bw = (w - left - right) / n;
  const labelW = Math.max(0, ...data.map((d) => String(d.label).length)) * charW + 6;
  const rows = labelW <= bw ? 1 : labelW <= 2 * bw ? 2 : 1;
  const every = rows === 2 || labelW <= bw ? 1 : Math.ceil(labelW / bw);
  const bottom = rows * rowH + 6;
  const ph = h - top - bottom;
  let out = "";
  data.forEach((d, i) => {
    const bh = Math.round((ph * d.value) / max);
    const x = left + i * bw + 2;
    out += `<rect x="${x}" y="${top + ph - bh}" width="${Math.max(bw - 4, 1)}" height="${bh}" data-value="${d.value}"><title>${esc(d.label)}: ${d.value}</title></rect>`;
    if (i % every !== 0) return;
    let cx = left + i * bw + bw / 2, anchor = "middle";
    if (cx - labelW / 2 < 0) (cx = left + i * bw), (anchor = "start");
    if (cx + labelW / 2 > w) (cx = left + (i + 1) * bw), (anchor = "end");
    const y = top + ph + rowH + (rows === 2 ? (i % 2) * rowH : 0);
    out += `<text class="axis" x="${cx}" y="${y}" text-anchor="${anchor}">${esc(d.label)}</text>`;
  });
  out += `<text class="axis-y" x="${left - 4}" y="${top + 4}" text-anchor="end">${max}</text><text class="axis-y" x="${left - 4}" y="${top + ph}" text-anchor="end">0</text>`;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.innerHTML = out;
}

// utcTime formats a time as HH:MM:SS in UTC, like every time the console shows.
function utcTime(d) {
  return d.toISOString().slice(11, 19);
}

function fmtSeconds(s) {
  if (!s) return "more";
  return s < 1 ? `≤${(s * 1000).toFixed(s < 0.001 ? 1 : 0)}ms` : `≤${s}s`;
}

async function refreshOverview() {
  try {
    const o = await api("overview");
    $("#tot-pending").textContent = o.pending;
    $("#tot-inflight").textContent = o.inflight;
    $("#tot-dead").textContent = o.dead;
    $("#updated").textContent = utcTime(new Date()) + " UTC";
    bars($("#due-chart"), o.due.map((b) => ({ label: b.label, value: b.count })));
    bars($("#lateness-chart"), (o.lateness || []).map((b) => ({ label: fmtSeconds(b.up_to_seconds), value: b.count })));
    bars($("#rate-chart"), o.rate.map((p) => ({ label: utcTime(new Date(p.start * 1000)), value: p.count })));
    $("#shards tbody").innerHTML = o.shards
      .map((s) => `<tr><td class="num">${s.shard}</td><td class="num">${s.pending}</td><td class="num">${s.inflight}</td><td class="num">${s.dead}</td><td>${esc(s.next_due || "–")}</td><td>${esc(s.owner || "–")}</td></tr>`)
      .join("");
  } catch (e) {
    $("#updated").textContent = "error: " + e.message;
  }
}

function renderDetail(e) {
  const d = $("#detail");
  const headers = Object.entries(e.headers || {}).map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v.join(", "))}</dd>`).join("");
  d.innerHTML = `
    <dl>
      <dt>Id</dt><dd id="detail-id">${esc(e.id)}</dd>
      <dt>State</dt><dd id="detail-state">${esc(stateText(e.state))}</dd>
      <dt>${e.state === "inflight" ? "Lease until" : e.state === "dead" ? "Died" : "Due"}</dt><dd>${esc(e.due)}</dd>
      <dt>Target</dt><dd>${esc(e.target)}</dd>
      <dt>Size</dt><dd>${e.size} bytes</dd>
      <dt>Attempts</dt><dd>${e.attempts}</dd>
      ${e.series ? `<dt>Series</dt><dd id="detail-series">${esc(e.series)}</dd><dt>Occurrence</dt><dd>${e.occurrence} (due ${esc(e.due)})</dd>` : ""}
      ${e.error ? `<dt>Last error</dt><dd>${esc(e.error)}</dd>` : ""}
      ${headers}
    </dl>
    ${e.hidden
      ? `<div class="note" id="payload-hidden">Payload and header values are hidden (ui.show_payloads is false).</div>`
      : `<div class="note">Payload${e.hex ? " (hex)" : ""}${e.size > 512 ? ", first 512 bytes" : ""}:</div>
    <pre>${esc(e.preview)}</pre>`}
    ${e.state === "dead"
      ? `<button id="replay-btn" ${state.actions ? "" : `disabled title="${READ_ONLY}"`}>Replay</button>
    <button id="purge-btn" class="danger" ${state.actions ? "" : `disabled title="${READ_ONLY}"`}>Purge</button>`
      : `<button id="cancel-btn" class="danger" ${state.actions ? "" : `disabled title="${READ_ONLY}"`}>Cancel</button>`}
    ${state.actions ? "" : `<p class="note read-only-note">${READ_ONLY}</p>`}`;
  d.hidden = false;
  if (e.state === "dead") {
    // A dead envelope is replayed or purged, as on the dead-set page.
    $("#replay-btn").onclick = () => deadAction("replay", [e.id]);
    $("#purge-btn").onclick = () => deadAction("purge", [e.id]);
    return;
  }
  $("#cancel-btn").onclick = async () => {
    if (!confirm(`Cancel envelope ${e.id}? It will not be delivered.`)) return;
    try {
      const r = await post("cancel", { id: e.id });
      toast(r.cancelled ? `cancelled ${e.id}` : `${e.id} was already gone`);
      d.innerHTML = `<p id="cancelled">Envelope ${esc(e.id)} cancelled.</p>`;
    } catch (err) {
      toast("cancel failed: " + err.message);
    }
  };
}

$("#find-id").onsubmit = async (ev) => {
  ev.preventDefault();
  const id = $("#find-id-input").value.trim();
  try {
    $("#find-empty").hidden = true;
    renderDetail(await api("envelope?id=" + encodeURIComponent(id)));
  } catch (e) {
    $("#detail").hidden = false;
    $("#detail").innerHTML = `<p id="not-found">${esc(e.message)}</p>`;
  }
};

function rowFor(e) {
  return `<tr><td><a href="#find" data-id="${esc(e.id)}">${esc(e.id)}</a></td><td>${esc(e.due)}</td><td>${esc(e.target)}</td><td class="num">${e.size}</td><td class="num">${e.attempts}</td><td title="${esc(STATE_NOTES[e.state] || "")}">${esc(e.state)}</td></tr>`;
}

async function browse(more) {
  const q = new URLSearchParams(state.browseQuery);
  if (more) q.set("cursor", state.browseNext);
  try {
    const page = await api("list?" + q.toString());
    const body = $("#browse-results tbody");
    $("#find-empty").hidden = true;
    $("#browse-results").hidden = false;
    body.innerHTML = (more ? body.innerHTML : "") + page.entries.map(rowFor).join("");
    if (!body.children.length) body.innerHTML = `<tr id="browse-none"><td colspan="6" class="note">No pending envelopes match${page.next ? " on this page" : ""}.</td></tr>`;
    state.browseNext = page.next || "";
    $("#browse-more").hidden = !state.browseNext;
  } catch (e) {
    toast(e.message);
  }
}

$("#browse").onsubmit = (ev) => {
  ev.preventDefault();
  const q = {};
  for (const [k, v] of new FormData(ev.target)) if (v) q[k] = v;
  state.browseQuery = q;
  browse(false);
};
$("#browse-more").onclick = () => browse(true);
$("#browse-results").onclick = async (ev) => {
  const id = ev.target.dataset && ev.target.dataset.id;
  if (!id) return;
  ev.preventDefault();
  $("#find-id-input").value = id;
  renderDetail(await api("envelope?id=" + encodeURIComponent(id)));
};

async function loadDead(more) {
  const q = new URLSearchParams({ dead: "1", limit: "100" });
  if (more) q.set("cursor", state.deadNext);
  const page = await api("list?" + q.toString());
  const body = $("#dead-table tbody");
  const rows = page.entries
    .map((e) => `<tr data-id="${esc(e.id)}"><td><input type="checkbox" class="dead-pick" value="${esc(e.id)}"></td><td>${esc(e.id)}</td><td>${esc(e.due)}</td><td>${esc(e.target)}</td><td class="num">${e.attempts}</td><td>${esc(e.error || "")}</td>
      <td><button class="replay-one action" data-id="${esc(e.id)}">Replay</button> <button class="purge-one action danger" data-id="${esc(e.id)}">Purge</button></td></tr>`)
    .join("");
  body.innerHTML = (more ? body.innerHTML : "") + rows;
  state.deadNext = page.next || "";
  $("#dead-more").hidden = !state.deadNext;
  document.querySelectorAll("#view-dead .action").forEach((b) => {
    b.disabled = !state.actions;
    if (!state.actions) b.title = READ_ONLY;
  });
  $("#dead-read-only").hidden = state.actions;
  if (!body.children.length) body.innerHTML = `<tr id="dead-none"><td colspan="7" class="note">No dead envelopes.</td></tr>`;
}

async function deadAction(verb, ids) {
  if (!ids.length) return toast("select dead envelopes first");
  if (verb === "purge" && !confirm(`Purge ${ids.length} dead envelope(s)? They are deleted for good.`)) return;
  try {
    const r = await post(verb, { ids });
    $("#dead-status").textContent = `${verb === "replay" ? "replayed" : "purged"} ${r.count}`;
    loadDead(false);
  } catch (e) {
    toast(`${verb} failed: ${e.message}`);
  }
}

const picked = () => [...document.querySelectorAll(".dead-pick:checked")].map((c) => c.value);
$("#dead-replay").onclick = () => deadAction("replay", picked());
$("#dead-purge").onclick = () => deadAction("purge", picked());
$("#dead-all").onchange = (ev) => document.querySelectorAll(".dead-pick").forEach((c) => (c.checked = ev.target.checked));
$("#dead-more").onclick = () => loadDead(true);
$("#dead-table").onclick = (ev) => {
  const id = ev.target.dataset && ev.target.dataset.id;
  if (!id) return;
  if (ev.target.classList.contains("replay-one")) deadAction("replay", [id]);
  if (ev.target.classList.contains("purge-one")) deadAction("purge", [id]);
};

async function loadTargets() {
  const t = await api("targets");
  const list = (xs) => (xs && xs.length ? xs.map(esc).join(", ") : "–");
  $("#policy").innerHTML = `<dt>Built-in deny</dt><dd>${list(t.builtin_deny)}</dd><dt>Allow</dt><dd>${t.allow && t.allow.length ? list(t.allow) : "everything not denied"}</dd><dt>Deny</dt><dd>${list(t.deny)}</dd><dt>Order</dt><dd>built-in deny (a $-subject opens only by an allow naming it), then allow, then deny</dd><dt>JetStream</dt><dd>${list(t.jetstream)}</dd>`;
  $("#targets-note").textContent = t.sampled ? `Pending counts over a sample of the ${t.sample_size} earliest pending envelopes (no full scan).` : "Pending counts over every pending envelope.";
  $("#targets-table tbody").innerHTML = t.targets.map((r) => `<tr><td>${esc(r.target)}</td><td class="num">${r.pending}</td><td class="num">${r.delivered_5m}</td></tr>`).join("");
}

// fmtDrain is how long a rule's backlog takes to go out; null: a pause
// holds parked envelopes until its resume.
function fmtDrain(r) {
  if (r.drain_seconds === null) return "paused";
  if (!r.rate) return "–";
  return r.drain_seconds < 60 ? `${r.drain_seconds.toFixed(1)} s` : `${(r.drain_seconds / 60).toFixed(1)} min`;
}

async function loadFlow() {
  const f = await api("flow");
  $("#flow-unavailable").hidden = f.available;
  $("#flow-actions").hidden = !f.available;
  $("#flow-read-only").hidden = state.actions || !f.available;
  const dis = state.actions ? "" : `disabled title="${READ_ONLY}"`;
  $("#flow-table tbody").innerHTML = f.rules.length
    ? f.rules
        .map((r) => `<tr><td>${esc(r.pattern)}</td><td>${esc(r.rate || "–")}</td><td class="num">${r.rate ? r.burst : "–"}</td><td>${esc(r.paused_since || "–")}</td>
      <td class="num">${r.limited}</td><td class="num">${r.parked}</td><td>${fmtDrain(r)}</td><td class="num">${r.rate ? r.current_rate + "/s" : "–"}</td>
      <td>${r.rate ? `<button class="limit-off action" data-pattern="${esc(r.pattern)}" ${dis}>Remove limit</button> ` : ""}${r.paused_since
        ? `<button class="resume-one action" data-pattern="${esc(r.pattern)}" ${dis}>Resume</button>`
        : `<button class="pause-one action danger" data-pattern="${esc(r.pattern)}" ${dis}>Pause</button>`}</td></tr>`)
        .join("")
    : `<tr id="flow-none"><td colspan="9" class="note">No limits or pauses.</td></tr>`;
  document.querySelectorAll("#view-flow form .action").forEach((b) => {
    b.disabled = !state.actions;
    if (!state.actions) b.title = READ_ONLY;
  });
}

// flowAction makes one change; it is answered once every live daemon
// holds it, so it takes a moment.
async function flowAction(verb, body, done) {
  try {
    const r = await post(verb, body);
    toast(done(r));
  } catch (e) {
    toast(`${verb} failed: ${e.message}`);
  }
  loadFlow().catch((e) => toast(e.message));
}

$("#limit-form").onsubmit = (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const body = { pattern: f.get("pattern").trim(), rate: f.get("rate").trim(), burst: Number(f.get("burst")) || 0 };
  flowAction("limit", body, (r) => (body.rate === "off" ? `removed the limit on ${body.pattern}` : `limited ${body.pattern} to ${r.rule.rate}, burst ${r.rule.burst}`));
};
$("#pause-form").onsubmit = (ev) => {
  ev.preventDefault();
  const pattern = new FormData(ev.target).get("pattern").trim();
  if (!confirm(`Pause every delivery to targets matching ${pattern}, fleet-wide, until resumed?`)) return;
  flowAction("pause", { pattern }, () => `paused ${pattern}`);
};
$("#flow-table").onclick = (ev) => {
  const pattern = ev.target.dataset && ev.target.dataset.pattern;
  if (!pattern) return;
  const released = (r) => `; ${r.released} held envelope(s) due now`;
  if (ev.target.classList.contains("limit-off")) flowAction("limit", { pattern, rate: "off" }, (r) => `removed the limit on ${pattern}${released(r)}`);
  if (ev.target.classList.contains("resume-one")) flowAction("resume", { pattern }, (r) => `resumed ${pattern}${released(r)}`);
  if (ev.target.classList.contains("pause-one") && confirm(`Pause every delivery to targets matching ${pattern}, fleet-wide, until resumed?`))
    flowAction("pause", { pattern }, () => `paused ${pattern}`);
};

function show(view) {
  document.querySelectorAll(".view").forEach((v) => (v.hidden = v.id !== "view-" + view));
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
  if (view === "dead") loadDead(false).catch((e) => toast(e.message));
  if (view === "targets") loadTargets().catch((e) => toast(e.message));
  if (view === "flow") loadFlow().catch((e) => toast(e.message));
}

window.onhashchange = () => show(location.hash.slice(1) || "overview");

(async function start() {
  try {
    const s = await api("session");
    state.csrf = s.csrf;
    state.actions = s.allow_actions;
    $("#mode").textContent = s.allow_actions ? "actions enabled" : "read-only (ui.allow_actions is off)";
    if (!s.allow_actions) $("#mode").title = READ_ONLY;
  } catch (e) {
    toast(e.message);
  }
  show(location.hash.slice(1) || "overview");
  refreshOverview();
  setInterval(refreshOverview, 2000);
})();
