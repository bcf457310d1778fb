"""The /ops page: lanes, a lane's timeline and actions, dead letters, MCP servers — one HTML file.

No build step and no external assets: one inline style and one inline script, allowed by hash
in a Content-Security-Policy that permits requests to this origin only. The page calls the
operator API with the token as a bearer header, never a cookie, so another site cannot make a
signed-in browser act (no CSRF); the token is kept in the tab's sessionStorage, read once from
the sign-in link's fragment (which browsers never send to a server) and then removed from the
address bar. Every text from the store is shown with ``textContent``. The MCP servers'
section shows only when the gateway has some.
"""

from __future__ import annotations

import base64
import hashlib

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

__all__ = ["ops_page_router"]

_STYLE = """
:root { color-scheme: light dark; --line: #8884; --soft: #8881; --accent: #3b6fd8; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 72rem; padding: 1rem; }
header { display: flex; gap: 1rem; align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 1.15rem; margin: 0; }
h2 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
.muted { opacity: .7; font-size: .85rem; }
.error { color: #d33; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line);
  vertical-align: top; }
tr.pick { cursor: pointer; }
tr.pick:hover, tr.chosen { background: var(--soft); }
.status { font-weight: 600; }
.status.stuck, .status.failed, .status.faulted { color: #d33; }
.status.suspended, .status.aborting, .status.restarting { color: #d90; }
.status.running { color: var(--accent); }
button { font: inherit; padding: .25rem .7rem; border-radius: .4rem; cursor: pointer;
  border: 1px solid var(--line); background: var(--soft); }
button.primary { background: var(--accent); color: white; border-color: var(--accent); }
.filters button.on { background: var(--accent); color: white; }
.panel { border: 1px solid var(--line); border-radius: .5rem; padding: .6rem .8rem;
  margin: .6rem 0; }
.row { display: flex; gap: .5rem; flex-wrap: wrap; align-items: center; margin: .3rem 0; }
.mono { font-family: ui-monospace, monospace; font-size: .85rem; word-break: break-all; }
input, select, textarea { font: inherit; padding: .25rem .4rem; }
.summary { white-space: pre-wrap; word-break: break-word; }
""".strip()

_SCRIPT = """
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  // Format characters (bidi overrides, zero-width ones) shown as \\uXXXX in what an operator
  // judges: an approval's arguments must not read as other values than the ones that run.
  const FORMAT = new RegExp("[\\u00ad\\u061c\\u180e\\u200b\\u200e\\u200f\\u202a-\\u202e" +
    "\\u2060-\\u2064\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb]", "g");
  const visible = (text) =>
    String(text).replace(FORMAT, (c) => "\\\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };
  const when = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 19);
  let token = sessionStorage.getItem("ops-token");
  // a sign-in link's #token=, at load or pasted into a tab that shows the page already (a
  // hash change loads nothing: the link did not sign in, and its token stayed in the address
  // bar and the history); taken, then taken out of both
  function tokenFromLink() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    const given = fragment.get("token");
    if (given) {
      token = given;
      sessionStorage.setItem("ops-token", token);
    }
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
    return Boolean(given);
  }
  tokenFromLink();
  let filter = "";
  let chosen = null;
  let role = null;  // the token's, from /whoami: a viewer is offered no action it cannot take

  async function api(method, path, body) {
    const headers = {Authorization: "Bearer " + token};
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      headers["Idempotency-Key"] = crypto.randomUUID();
    }
    const response = await fetch("/api/v1" + path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (response.status === 401) { signOut("the token was refused: sign in again"); }
    if (!response.ok) {
      const error = (data && data.error) || {};
      throw new Error((error.message || ("HTTP " + response.status)) +
        (error.code ? " (" + error.code + ")" : ""));
    }
    return data;
  }

  function signOut(why) {
    sessionStorage.removeItem("ops-token");
    token = null;
    role = null;
    $("who").textContent = "";
    signedIn(false);
    $("signin-error").textContent = why || "";
  }

  // a look-alike name (letters of two scripts) is shown spelled out too: web:pay vs web:p\\u0430y
  function named(lane) {
    return lane.lane_spelled ? lane.lane + " (" + lane.lane_spelled + ")" : lane.lane;
  }
  function cell(row, text, cls) { const td = el("td", cls, text); row.appendChild(td); return td; }

  async function loadBacklog() {
    const b = await api("GET", "/backlog");
    $("backlog").textContent = "inbox " + b.inbox_pending + " waiting, outbox " +
      b.outbox_pending + " waiting (oldest due " + Math.round(b.outbox_oldest_age_ms / 1000) +
      " s), " + b.dead_letters + " dead letters, " + b.inbox_rejected + " refused messages";
  }

  async function loadLanes() {
    let items = [];
    let cursor = null;
    do {
      const query = "?limit=100" + (filter ? "&status=" + filter : "") +
        (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
      const page = await api("GET", "/lanes" + query);
      items = items.concat(page.items);
      cursor = page.next_cursor;
    } while (cursor && items.length < 1000);
    const body = $("lanes");
    // as `gateway ops lanes` says it: an idle lane's last error is history (after an unrevoke
    // the lanes a revocation ended read "authority_revoked", as if still revoked)
    const why = (lane) => {
      if (lane.revoked) return "revoked: " + lane.revoked.why;
      if (lane.status === "faulted") return lane.fault || "";
      if (lane.status === "failed" && lane.error) return lane.error.code;
      if (lane.suspended) return lane.suspended;
      if (lane.status === "idle" && lane.last_outcome) return "last: " + lane.last_outcome;
      return "";
    };
    body.replaceChildren();
    for (const lane of items) {
      const row = el("tr", "pick" + (chosen === lane.id ? " chosen" : ""));
      cell(row, lane.session, "mono");
      cell(row, named(lane), "mono");
      cell(row, lane.status, "status " + lane.status);
      cell(row, why(lane), "why");
      cell(row, lane.operation_id ? lane.attempts + " / " + lane.max_attempts : "");
      cell(row, lane.activity || lane.last_outcome || "");
      row.addEventListener("click", () => { chosen = lane.id; showLane(); loadLanes(); });
      body.appendChild(row);
    }
    $("lanes-empty").hidden = items.length > 0;
  }

  function actionButton(label, run, primary) {
    const button = el("button", primary ? "primary" : "", label);
    button.type = "button";
    if (role !== "operator") {
      button.disabled = true;
      button.title = "this token is a viewer's: acting needs an operator token";
      return button;
    }
    button.addEventListener("click", async () => {
      button.disabled = true;
      $("lane-note").textContent = label + "...";
      try {
        const result = await run();
        if (result !== false) {
          $("lane-note").textContent = label + ": " +
            (result && result.status ? result.status + (result.outcome ? " (" +
            result.outcome + ")" : "") : "done");
        } else {
          $("lane-note").textContent = "";
        }
      } catch (error) {
        $("lane-note").textContent = label + " refused: " + error.message;
      }
      button.disabled = false;
      await refresh();
    });
    return button;
  }

  function consequence(lane, policy) {
    if (!lane.interrupted_calls.length) return "no tool call is interrupted: the run continues";
    return lane.interrupted_calls.map((c) => c.tool_name + " (" + c.tool_call_id + ", replay=" +
      c.replay + "): " + c.on_resume[policy]).join("; ");
  }

  async function showLane() {
    const box = $("lane");
    if (!chosen) { box.hidden = true; return; }
    let lane;
    try { lane = await api("GET", "/lanes/" + chosen); }
    catch (error) { box.hidden = true; return; }
    box.hidden = false;
    $("lane-title").textContent = lane.session + " / " + named(lane);
    const facts = $("lane-facts");
    facts.replaceChildren();
    const add = (label, value) => {
      if (value === null || value === undefined || value === "") return;
      const row = el("div", "row");
      row.append(el("span", "muted", label), el("span", "", value));
      facts.appendChild(row);
    };
    add("status", lane.status + (lane.suspended ? " (" + lane.suspended + ")" : ""));
    add("operation", lane.operation_id ? lane.operation_kind + " " + lane.operation_id : "");
    add("attempts", lane.operation_id ? lane.attempts + " of " + lane.max_attempts : "");
    add("token budget", lane.token_budget);
    add("last doing", lane.activity);
    add("last outcome", lane.last_outcome);
    add("error", lane.error ? lane.error.code + ": " + lane.error.message : "");
    add("fault", lane.fault);
    add("worker", lane.held_by);
    if (lane.revoked) {
      const r = lane.revoked;
      add("revoked", r.why + " (" + r.scope_name + "; by " + r.by + ", " + when(r.at_ms) +
        " UTC): its run ends, its messages are kept and not run, nothing is posted");
    }
    const actions = $("lane-actions");
    const id = lane.id;
    // rebuilt only when what it offers changes: the 3 s refresh must not wipe what an operator
    // is typing (a result, a reason) nor take the focus away
    const shape = JSON.stringify([role, lane.id, lane.status, lane.actions, lane.wait_id,
      lane.pending_approvals, lane.interrupted_calls, lane.revoked, lane.token_budget]);
    if (actions.dataset.shape !== shape) {
    actions.dataset.shape = shape;
    actions.replaceChildren();
    if (lane.actions.includes("resume")) {
      const choice = el("select");
      for (const policy of ["declared", "never", "always"]) {
        const option = el("option", "", "tool_recovery=" + policy);
        option.value = policy;
        choice.appendChild(option);
      }
      const says = el("div", "muted summary");
      const explain = () => { says.textContent = "on resume: " + consequence(lane, choice.value); };
      choice.addEventListener("change", explain);
      explain();
      const verb = lane.status === "stuck" ? "Resume (fresh attempt budget)" : "Resume";
      actions.append(choice, actionButton(verb, () => {
        if (!confirm(verb + " " + named(lane) + "?\\n" + says.textContent)) return false;
        return api("POST", "/lanes/" + id + "/resume", {tool_recovery: choice.value});
      }, true), says);
    }
    if (lane.actions.includes("abort")) {
      actions.appendChild(actionButton("Abort", () => {
        if (!confirm("Abort the open operation of " + named(lane) + "?")) return false;
        return api("POST", "/lanes/" + id + "/abort");
      }));
    }
    if (!lane.revoked) {
      actions.appendChild(actionButton("Revoke", () => {
        const reason = prompt("Revoke " + named(lane) + ": its run ends, its messages are kept " +
          "and not run, nothing more is posted in its thread. Why?");
        if (reason === null) return false;
        return api("POST", "/lanes/" + id + "/revoke", {reason: reason || null});
      }));
    }
    if (lane.actions.includes("unrevoke")) {
      actions.appendChild(actionButton("Unrevoke", () => {
        if (!confirm("Give " + lane.revoked.scope_name + " its authority back?")) return false;
        return api("POST", "/lanes/" + id + "/unrevoke");
      }, true));
    }
    if (lane.token_budget !== null && lane.token_budget !== undefined) {
      // D295: the lane's own budget over its profile's; empty gives it the profile's again
      actions.appendChild(actionButton("Set token budget", () => {
        const given = prompt("Tokens " + named(lane) + " may spend in all, what it spent " +
          "included (now " + lane.token_budget + "; empty: its profile's budget again):",
          String(lane.token_budget));
        if (given === null) return false;
        const cleaned = given.replace(/[,_\\s]/g, "");
        // digits only, as the CLI takes them (Number() would read "1e6" and "0x10" too)
        const tokens = cleaned === "" ? null : (/^[0-9]+$/.test(cleaned) ? Number(cleaned) : NaN);
        if (tokens !== null && !(Number.isInteger(tokens) && tokens >= 1)) {
          throw new Error("not a number of tokens: " + given);
        }
        return api("PUT", "/lanes/" + id + "/budget", {tokens: tokens});
      }));
    }
    if (lane.actions.includes("retry")) {
      actions.appendChild(actionButton("Retry", () => {
        if (!confirm("Run the failed run of " + named(lane) + " again?")) return false;
        return api("POST", "/lanes/" + id + "/retry");
      }, true));
    }
    if (lane.actions.includes("decide")) {
      const table = el("div");
      for (const call of lane.pending_approvals) {
        const row = el("div", "panel");
        row.append(el("div", "", visible(call.tool_name + " (" + call.tool_call_id + ")")),
          el("div", "mono", visible(JSON.stringify(call.arguments))));
        table.appendChild(row);
      }
      const reason = el("input");
      reason.placeholder = "reason (for deny)";
      const calls = lane.pending_approvals.map((c) => c.tool_name + " (" + c.tool_call_id + ")");
      const decide = (verdict) => () => {
        // a click on the neighbouring button is not undone: asked first, as every action is
        const verb = verdict === "approve" ? "Approve" : "Deny";
        if (!confirm(verb + " every pending call of " + named(lane) + "?\\n" + calls.join("\\n"))) {
          return false;
        }
        const approvals = {};
        for (const call of lane.pending_approvals) {
          approvals[call.tool_call_id] = {action: verdict, reason: reason.value || null};
        }
        return api("POST", "/lanes/" + id + "/decisions", {wait_id: lane.wait_id, approvals});
      };
      actions.append(table, actionButton("Approve all", decide("approve"), true),
        actionButton("Deny all", decide("deny")), reason);
      // done by hand: the calls' result instead of running them (the tool never runs)
      const result = el("textarea");
      result.placeholder = "what you did: the result the agent reads";
      result.setAttribute("aria-label", "result");
      result.rows = 3;
      result.cols = 60;
      const failedBox = el("input");
      failedBox.type = "checkbox";
      const failed = el("label", "muted");
      failed.append(failedBox, document.createTextNode(" the action failed"));
      const supply = () => {
        if (!result.value.trim()) throw new Error("write what the action did first");
        if (!confirm("Answer every pending call of " + named(lane) + " with this result? They " +
          "will not run.\\n" + calls.join("\\n"))) return false;
        const approvals = {};
        for (const call of lane.pending_approvals) {
          approvals[call.tool_call_id] = {
            action: "supply", result: result.value, is_error: failedBox.checked,
          };
        }
        return api("POST", "/lanes/" + id + "/decisions", {wait_id: lane.wait_id, approvals});
      };
      const done = el("div", "row");
      done.append(result, failed, actionButton("Done it myself", supply));
      actions.appendChild(done);
    }
    }
    // the newest 500: a thread that ran for days and then went stuck showed its first day
    let timeline = await api("GET", "/lanes/" + id + "/timeline?limit=500");
    let items = timeline.items;
    let pages = 1;
    while (timeline.next_cursor && pages < 20) {
      timeline = await api("GET", "/lanes/" + id + "/timeline?limit=500&cursor=" +
        encodeURIComponent(timeline.next_cursor));
      items = items.concat(timeline.items).slice(-500);
      pages += 1;
    }
    const cut = pages > 1 || timeline.next_cursor;
    $("timeline-more").hidden = !cut;
    $("timeline-more").textContent = timeline.next_cursor
      ? "A window of 500 items after the first " + ((pages - 1) * 500) + " is shown; " +
        "the whole log: gateway ops timeline " + lane.lane + " --limit N"
      : "The newest 500 items are shown; the whole log: gateway ops timeline " + lane.lane +
        " --limit N";
    const body = $("timeline");
    body.replaceChildren();
    for (const item of items) {
      const row = el("tr");
      cell(row, item.seq);
      cell(row, when(item.at_ms), "mono");
      cell(row, item.type);
      const summary = cell(row, item.summary, "summary");
      if (item.kind === "entry" && item.type === "message" && lane.actions.includes("rewind") &&
          item.summary.startsWith("user:")) {
        summary.appendChild(el("span", "", " "));
        summary.appendChild(actionButton("Rewind here", () => {
          if (!confirm("Move " + named(lane) + " before this message and run it again?")) {
            return false;
          }
          return api("POST", "/lanes/" + id + "/rewind", {entry_id: item.id});
        }));
      }
      body.appendChild(row);
    }
    const where = "&lane=" + encodeURIComponent(lane.lane) + "&session=" +
      encodeURIComponent(lane.session);
    let trail = await api("GET", "/audit?limit=100" + where);
    let events = trail.items;
    for (let more = 1; trail.next_cursor && more < 20; more += 1) {  // the newest 100
      trail = await api("GET", "/audit?limit=100" + where + "&cursor=" +
        encodeURIComponent(trail.next_cursor));
      events = events.concat(trail.items).slice(-100);
    }
    const audit = $("audit");
    audit.replaceChildren();
    for (const event of events) {
      const row = el("tr");
      cell(row, when(event.at_ms), "mono");
      cell(row, event.actor);
      cell(row, event.action);
      cell(row, event.outcome);
      cell(row, JSON.stringify(event.details), "mono");
      audit.appendChild(row);
    }
  }

  async function loadRetrying() {
    // replies whose attempts failed and that wait for their next one: "oldest due" is 0 s
    // while a reply waits an hour between two attempts
    const page = await api("GET", "/deliveries?status=pending&limit=100");
    const body = $("retrying");
    body.replaceChildren();
    const failed = page.items.filter((d) => d.attempts > 0 && d.last_error);
    for (const d of failed) {
      const row = el("tr");
      cell(row, d.id, "mono");
      cell(row, d.lane, "mono");
      cell(row, d.attempts);
      cell(row, d.last_error);
      cell(row, when(d.created_at_ms), "mono");
      body.appendChild(row);
    }
    $("retrying-section").hidden = failed.length === 0;
    $("retrying-more").hidden = page.next_cursor === null;
  }

  async function loadDead() {
    const page = await api("GET", "/deliveries?status=dead&limit=100");
    const body = $("dead");
    body.replaceChildren();
    $("dead-more").hidden = page.next_cursor === null;
    for (const d of page.items) {
      const row = el("tr");
      cell(row, d.id, "mono");
      cell(row, d.lane, "mono");
      cell(row, d.attempts);
      cell(row, d.last_error || "");
      const act = cell(row, "");
      act.append(
        actionButton("Redeliver", () => {
          if (!confirm("Redeliver " + d.id + "? It is sent into its thread again now.")) {
            return false;
          }
          return api("POST", "/deliveries/" + encodeURIComponent(d.id) + "/redeliver");
        }),
        actionButton("Discard", () => {
          if (!confirm("Discard delivery " + d.id + "? It will never be sent.")) return false;
          return api("POST", "/deliveries/" + encodeURIComponent(d.id) + "/discard");
        }));
      body.appendChild(row);
    }
    $("dead-empty").hidden = page.items.length > 0;
  }

  async function loadMcp() {
    const view = await api("GET", "/mcp");
    const body = $("mcp-servers");
    body.replaceChildren();
    for (const s of view.servers) {
      const row = el("tr");
      cell(row, s.name, "mono");
      cell(row, s.transport);
      cell(row, s.target, "mono");
      cell(row, s.state + (s.state === "restarting" && s.retry_at_ms ?
        " (next " + when(s.retry_at_ms).slice(11) + ")" : ""), "status " + s.state);
      cell(row, s.trusted ? "yes" : "no");
      cell(row, s.tools.length).title = s.tools.join("\\n");
      cell(row, s.restarts);
      cell(row, s.calls + " / " + s.failures);
      const fault = cell(row, s.last_error || "", "summary");
      if (s.stderr) {  // what the server printed as it stopped: often the only "why"
        fault.appendChild(el("div", "stderr mono", "stderr: " + s.stderr));
      }
      body.appendChild(row);
    }
    $("mcp").hidden = view.servers.length === 0;
  }

  async function refresh() {
    if (!token) return;
    try {
      if (role === null) {
        const me = await api("GET", "/whoami");
        role = me.role;
        $("who").textContent = "signed in as " + visible(me.name) + " (" + me.role +
          (me.role === "operator" ? ")" : ": reads only)");
      }
      await Promise.all([loadBacklog(), loadLanes(), loadRetrying(), loadDead(), loadMcp()]);
      await showLane();
      $("app-error").textContent = "";
    } catch (error) {
      $("app-error").textContent = error.message;
    }
  }

  for (const button of document.querySelectorAll(".filters button")) {
    button.addEventListener("click", () => {
      filter = button.dataset.status;
      for (const other of document.querySelectorAll(".filters button")) {
        other.classList.toggle("on", other === button);
      }
      refresh();
    });
  }
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("token").value.trim();
    if (!token) return;
    sessionStorage.setItem("ops-token", token);
    $("token").value = "";
    $("signin-error").textContent = "";
    signedIn(true);
    refresh();
  });
  $("signout").addEventListener("click", () => signOut("signed out"));
  function signedIn(yes) {
    $("signin").hidden = yes;
    $("app").hidden = !yes;
    $("signout").hidden = !yes;
  }
  signedIn(Boolean(token));
  if (token) refresh();
  window.addEventListener("hashchange", () => {
    if (!tokenFromLink()) return;
    $("signin-error").textContent = "";
    signedIn(true);
    refresh();
  });
  setInterval(refresh, 3000);
})();
""".strip()

_BODY = """
<header><h1>Gateway operations</h1><span class="muted" id="backlog"></span>
<span class="muted" id="who"></span>
<button type="button" id="signout">Sign out</button></header>
<section id="signin" hidden>
  <h2>Sign in</h2>
  <p class="muted">Paste an operator or viewer token (the sign-in link that
  <code>gateway serve</code> prints does this for you). It is kept in this tab only.</p>
  <form id="signin-form" class="row" autocomplete="off">
    <input id="token" type="password" size="50" placeholder="token" aria-label="token">
    <button class="primary" type="submit">Sign in</button>
  </form>
  <p class="error" id="signin-error"></p>
</section>
<main id="app" hidden>
  <p class="error" id="app-error"></p>
  <h2>Lanes</h2>
  <div class="row filters">
    <button type="button" class="on" data-status="">all</button>
    <button type="button" data-status="stuck">stuck</button>
    <button type="button" data-status="suspended">suspended</button>
    <button type="button" data-status="failed">failed</button>
    <button type="button" data-status="running">running</button>
    <button type="button" data-status="faulted">faulted</button>
  </div>
  <table><thead><tr><th>session</th><th>lane</th><th>status</th><th>why</th>
  <th>attempts</th><th>doing / last</th></tr></thead><tbody id="lanes"></tbody></table>
  <p class="muted" id="lanes-empty" hidden>No lanes (yet).</p>
  <section id="lane" class="panel" hidden>
    <h2 id="lane-title"></h2>
    <div id="lane-facts"></div>
    <div class="row" id="lane-actions"></div>
    <p class="muted" id="lane-note"></p>
    <h2>Timeline</h2>
    <p class="muted" id="timeline-more" hidden></p>
    <table><thead><tr><th>seq</th><th>time (UTC)</th><th>type</th><th>what</th></tr></thead>
    <tbody id="timeline"></tbody></table>
    <h2>Audit trail (workers and operators)</h2>
    <table><thead><tr><th>time (UTC)</th><th>who</th><th>action</th><th>outcome</th>
    <th>details</th></tr></thead><tbody id="audit"></tbody></table>
  </section>
  <section id="retrying-section" hidden>
    <h2>Retrying</h2>
    <table><thead><tr><th>delivery</th><th>lane</th><th>attempts</th><th>last failure</th>
    <th>made (UTC)</th></tr></thead><tbody id="retrying"></tbody></table>
    <p class="muted" id="retrying-more" hidden>Only the first 100 waiting replies were
    looked at: <code>gateway ops deliveries --status pending</code> lists them all.</p>
  </section>
  <h2>Dead letters</h2>
  <table><thead><tr><th>delivery</th><th>lane</th><th>attempts</th><th>why</th><th></th></tr>
  </thead><tbody id="dead"></tbody></table>
  <p class="muted" id="dead-empty" hidden>No dead letters.</p>
  <p class="muted" id="dead-more" hidden>The first 100 dead letters are shown:
  <code>gateway ops deliveries</code> lists them all.</p>
  <section id="mcp" hidden>
    <h2>MCP servers</h2>
    <table><thead><tr><th>server</th><th>transport</th><th>target</th><th>state</th>
    <th>trusted</th><th>tools</th><th>restarts</th><th>calls / failures</th>
    <th>last error</th></tr></thead><tbody id="mcp-servers"></tbody></table>
  </section>
</main>
""".strip()


def _digest(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def _page() -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>Gateway operations</title><style>{_STYLE}</style></head>"
        f"<body>{_BODY}<script>{_SCRIPT}</script></body></html>"
    )


_HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_digest(_SCRIPT)}; style-src {_digest(_STYLE)}; "
        "connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def ops_page_router() -> APIRouter:
    """``GET /ops``: the page (it holds no data; everything comes from the API, signed in)."""
    router = APIRouter()
    page = _page()

    @router.get("/ops", include_in_schema=False)
    async def ops_page() -> HTMLResponse:
        return HTMLResponse(page, headers=_HEADERS)

    return router
