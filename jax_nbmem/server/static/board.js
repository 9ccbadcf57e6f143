// The GPU board: every GPU's memory over the last minutes, every process on it joined to its
// kernel, notebook and user, the warnings, and a shut-down button (with a confirmation) for
// this server's kernels that block others. All text from other people goes in as text nodes.
"use strict";

const REFRESH_MS = 2000;
const api = (path) => `${SETTINGS.baseUrl.replace(/\/$/, "")}/jax-nbmem/api/${path}`;
const pending = new Set(); // PIDs whose shutdown is being confirmed or done

// The XSRF token: the server's `_xsrf` cookie when the page can read it, else the one the page
// was served with. JupyterLab's ServerConnection does the same.
function xsrfToken() {
  const found = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  return found ? decodeURIComponent(found[1]) : SETTINGS.xsrfToken;
}

// Every request the page makes carries the XSRF token, GETs included: JupyterHub >= 4.1
// refuses a cookie-authenticated fetch without it (403), as a plain Jupyter server does
// for anything but a GET.
function request(path, options = {}) {
  return fetch(api(path), {
    credentials: "same-origin",
    ...options,
    headers: { "X-XSRFToken": xsrfToken(), ...(options.headers || {}) },
  });
}

// What a refused or failed answer means to the person looking at the board.
function refusal(reply) {
  if (reply.status === 403) {
    return "status 403: not logged in, or the login expired (reload the page to log in again)";
  }
  return `status ${reply.status}`;
}

function gib(bytes) {
  if (bytes === null || bytes === undefined) {
    return "—";
  }
  return bytes >= 2 ** 30 ? `${(bytes / 2 ** 30).toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) {
    return "—";
  }
  if (seconds < 90) {
    return `${Math.round(seconds)} s`;
  }
  return seconds < 5400 ? `${Math.round(seconds / 60)} min` : `${(seconds / 3600).toFixed(1)} h`;
}

function element(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) {
    node.textContent = String(text);
  }
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  return node;
}

function sparkline(points) {
  const svgNs = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNs, "svg");
  svg.setAttribute("viewBox", "0 0 600 90");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const known = points.filter((p) => p[1] !== null && p[2]);
  svg.setAttribute("aria-label", known.length ? `used memory over the last ${duration(known[known.length - 1][0] - known[0][0])}` : "no readings yet");
  if (known.length < 2) {
    return svg;
  }
  const t0 = known[0][0];
  const t1 = known[known.length - 1][0];
  const total = Math.max(...known.map((p) => p[2]));
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * 600;
  const y = (b) => 88 - (b / total) * 86;
  // Steps, as memory moves: each reading holds until the next.
  let path = `M${x(known[0][0])},88 L${x(known[0][0])},${y(known[0][1])}`;
  let last = known[0][1];
  for (const [t, used] of known.slice(1)) {
    path += ` L${x(t)},${y(last)} L${x(t)},${y(used)}`;
    last = used;
  }
  path += ` L${x(t1)},88 Z`;
  const area = document.createElementNS(svgNs, "path");
  area.setAttribute("d", path);
  area.setAttribute("fill", "#0969da33");
  area.setAttribute("stroke", "#0969da");
  area.setAttribute("vector-effect", "non-scaling-stroke");
  svg.appendChild(area);
  return svg;
}

// The hub's user name where there is one (in container hubs every Unix user is `jovyan`).
// A process in a container is named by its container's user ("jovyan in its container"),
// never by the host's account of the same uid: `user_shown`, the status line's words.
function owner(process) {
  const hub = process.hub_user;
  const unix = process.user_shown || process.user;
  if (hub && (hub !== process.user || process.user_source)) {
    return unix ? `${hub} (Unix user ${unix})` : hub;
  }
  return unix || "";
}

// Where a process runs when it is in a container, in the status line's words ("container
// notebook in pod jhub/jupyter-alice"), with its PID there; "" on the host itself.
function where(process) {
  if (!process.container_shown) {
    return "";
  }
  const inner = process.pid_in_container;
  return inner === null || inner === undefined ? process.container_shown : `${process.container_shown} (PID ${inner} there)`;
}

function notebookCell(process) {
  const cell = element("td", process.notebook_shown || process.notebook || process.cmdline || "");
  if (where(process)) {
    cell.appendChild(element("div", where(process), { class: "note container" }));
  }
  return cell;
}

function say(text) {
  document.getElementById("message").textContent = text;
}

async function shutdown(kernelId, pid, cell) {
  cell.replaceChildren(element("span", `Stopping kernel PID ${pid}…`));
  try {
    const reply = await request(`kernels/${encodeURIComponent(kernelId)}/shutdown`, { method: "POST" });
    if (!reply.ok) {
      throw new Error(`${reply.status} ${(await reply.json().catch(() => ({}))).message || ""}`);
    }
    say(`Stopped kernel PID ${pid}.`);
  } catch (error) {
    pending.delete(pid);
    say(`Could not stop kernel PID ${pid}: ${error.message}`);
  }
  refresh();
}

function actionCell(process, kernelIds, blocking) {
  const cell = element("td");
  const kernelId = process.kernel_id;
  if (!kernelId || !kernelIds.has(kernelId) || !blocking.has(process.pid) || pending.has(process.pid)) {
    return cell;
  }
  const ask = element("button", `Shut down PID ${process.pid}`);
  ask.addEventListener("click", () => {
    pending.add(process.pid);
    const confirm = element("button", `Confirm: shut down PID ${process.pid}`, { class: "danger" });
    const cancel = element("button", "Cancel");
    confirm.addEventListener("click", () => shutdown(kernelId, process.pid, cell));
    cancel.addEventListener("click", () => {
      pending.delete(process.pid);
      refresh();
    });
    cell.replaceChildren(confirm, document.createTextNode(" "), cancel);
  });
  cell.appendChild(ask);
  return cell;
}

function gpuSection(gpu, processes, history, kernelIds, blocking) {
  // A MIG instance is a GPU of its own: "MIG 3g.71gb instance 1 of GPU 0" (its label).
  const label = gpu.label || `GPU ${gpu.index}`;
  const section = element("section", null, { class: "gpu", "aria-label": label });
  section.appendChild(element("h2", `${label}: ${gpu.name || "name unknown"} · ${gib(gpu.used_bytes)} used of ${gib(gpu.total_bytes)} · ${gib(gpu.free_bytes)} free`));
  if (gpu.mig_mode) {
    section.appendChild(element("div", "in MIG mode: its MIG instances are the GPUs, each shown on its own", { class: "note" }));
  }
  if (gpu.problem) {
    section.appendChild(element("div", gpu.problem, { class: "note" }));
  }
  const points = history[gpu.uuid] || [];
  section.appendChild(sparkline(points));
  if (points.length > 1) {
    const minutes = Math.max(1, Math.round((points[points.length - 1][0] - points[0][0]) / 60));
    section.appendChild(element("div", `used memory over the last ${minutes} min, from 0 to ${gib(gpu.total_bytes)}`, { class: "note" }));
  }
  if (gpu.mig_mode) {
    return section; // its processes are listed under its instances
  }
  const table = element("table");
  const head = element("tr");
  for (const title of ["PID", "kind", "kernel", "notebook", "user", "mode", "JAX pool", "idle", "GPU memory", ""]) {
    head.appendChild(element("th", title, { scope: "col" }));
  }
  table.appendChild(head);
  const mine = processes.filter((p) => p.gpu === gpu.index).sort((a, b) => (b.used_bytes || 0) - (a.used_bytes || 0));
  for (const process of mine) {
    const row = element("tr");
    const pool = process.jax ? process.jax.pool_bytes : null;
    const mode = process.mode || process.mode_at_start || (process.preallocated ? "preallocated" : "");
    row.append(
      element("td", process.pid),
      element("td", process.kind),
      element("td", process.kernel_id ? process.kernel_id.slice(0, 8) : ""),
      notebookCell(process),
      element("td", owner(process)),
      element("td", mode, process.mode_reason ? { title: `chosen by auto: ${process.mode_reason}` } : {}),
      element("td", gib(pool), { class: "bytes" }),
      element("td", duration(process.idle_s)),
      element("td", gib(process.used_bytes), { class: "bytes" }),
      actionCell(process, kernelIds, blocking),
    );
    table.appendChild(row);
  }
  if (!mine.length) {
    const row = element("tr");
    row.appendChild(element("td", "no processes", { colspan: "10", class: "note" }));
    table.appendChild(row);
  }
  section.appendChild(table);
  return section;
}

function render(status, history) {
  const kernelIds = new Set((status.kernels || []).map((k) => k.kernel_id));
  const blocking = new Set((status.warnings || []).filter((w) => w.kind === "blocking-preallocation").map((w) => w.pid));
  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...(status.warnings || []).map((w) => element("div", `${w.kind}: ${w.message}`, { class: "warning", role: "alert" })));
  const gpus = document.getElementById("gpus");
  if (!status.nvml.available) {
    gpus.replaceChildren(element("section", `No GPU seen: ${status.nvml.reason || "NVML is unavailable"}.`, { class: "gpu" }));
  } else {
    // A MIG instance right after the GPU it splits.
    const place = (g) => (g.mig ? [g.mig.parent_index, g.index] : [g.index, -1]);
    const shown = status.gpus.slice().sort((a, b) => place(a)[0] - place(b)[0] || place(a)[1] - place(b)[1]);
    gpus.replaceChildren(...shown.map((g) => gpuSection(g, status.processes || [], history, kernelIds, blocking)));
  }
  const server = status.server || {};
  document.getElementById("age").textContent = `updated ${duration(server.age_s)} ago · ${kernelIds.size} kernel(s) on this server`;
  document.getElementById("problem").textContent = server.problem || "";
}

async function refresh() {
  try {
    const [status, history] = await Promise.all([
      request("status"),
      request("history"),
    ]);
    if (status.status === 503) {
      document.getElementById("age").textContent = "taking the first snapshot…";
      return;
    }
    for (const reply of [status, history]) {
      if (!reply.ok) {
        throw new Error(refusal(reply));
      }
    }
    render(await status.json(), (await history.json()).gpus || {});
  } catch (error) {
    document.getElementById("problem").textContent = `cannot reach the server: ${error.message}`;
  }
}

refresh();
setInterval(() => {
  if (!document.hidden && !document.querySelector("button.danger")) {
    refresh(); // a confirmation on screen is not redrawn away
  }
}, REFRESH_MS);
