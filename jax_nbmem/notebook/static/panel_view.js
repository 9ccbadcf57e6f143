// The panel's plot: draws the figure parts the kernel syncs (timeline, cells, bars, layout)
// with plotly.js. Every view reads the model's current state, so a second view, or one made
// after a page reload, draws the same picture as the first and follows the same updates.
//
// plotly.js is not part of this module (the module is stored in every notebook that shows the
// panel): a view loads the plotly.js of the installed plotly package, once per page, from
//   1. the Jupyter server of this page (JupyterLab, Notebook 7): the jax_nbmem server
//      extension serves it under the page's base URL, and the browser keeps it;
//   2. else the kernel (VS Code, Colab, Voilà, a server without jax_nbmem): it sends the file
//      unasked with its first panel, from the cell that shows it, as a message of its own
//      that no notebook stores; a view that missed it (a page reloaded later) asks over the
//      widget's comm, and the answer comes once the kernel is between cells;
//   3. else nothing: the static snapshot under the widget stays in view.
// Nothing comes from a CDN.

const PARTS = ["timeline", "cells", "bars", "plot_layout"];
const CONFIG = { displaylogo: false, responsive: true };
const SERVER_ROUTE = "jax-nbmem/static/plotly.min.js";
const KERNEL_REQUEST = "send-plotly.js"; // jax_nbmem/notebook/panel_view.py: PLOTLY_REQUEST
const KERNEL_REPLY = "plotly.js"; // PLOTLY_REPLY
const KERNEL_WAIT_MS = 60000; // 4.6 MB over a slow link; a page without a kernel gives up
// The view's own clock (panel_view.py): while the panel is live, silence for this many update
// intervals (at least the floor) asks the kernel with a ping; longer, and it is not "Live".
const PING = "ping"; // panel_view.py: PING
const PONG = "pong"; // PONG
const PING_AFTER = { intervals: 4, floorMs: 1500 };
const STALE_AFTER = { intervals: 10, floorMs: 3000 };
const PING_EVERY_MS = 1500;
const CLOCK_TICK_MS = 500;

// plotly.min.js is a UMD bundle. Run as a function with a local `module`, it hands its export
// over whatever loaders the page has (an AMD `define` would otherwise take it). A Function
// body is not strict, as the older bundles expect; where a page forbids eval, an ES module
// made from the same text is the fallback.
function evaluatePlotly(source) {
  const module = { exports: {} };
  try {
    new Function("module", "exports", source).call(globalThis, module, module.exports);
    return Promise.resolve(module.exports);
  } catch (error) {
    const text = `const module = { exports: {} }; const exports = module.exports;\n${source}\nexport default module.exports;`;
    const url = URL.createObjectURL(new Blob([text], { type: "text/javascript" }));
    return import(url).then((loaded) => loaded.default).finally(() => URL.revokeObjectURL(url));
  }
}

// The page's Jupyter server settings (JupyterLab and Notebook 7 write them into the page).
function pageConfig() {
  const node = document.getElementById("jupyter-config-data");
  if (!node) {
    return null;
  }
  try {
    return JSON.parse(node.textContent);
  } catch (error) {
    return null;
  }
}

async function fromServer(config) {
  const base = String(config.baseUrl).replace(/\/?$/, "/");
  const url = new URL(base + SERVER_ROUTE, window.location.href);
  // The login cookie goes with it, and the XSRF header that JupyterLab's own requests carry
  // (a hub may check it on fetches, GETs included); a page opened with a token sends that.
  const headers = {};
  const xsrf = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  if (xsrf) {
    headers["X-XSRFToken"] = xsrf[1];
  }
  if (config.token) {
    headers.Authorization = `token ${config.token}`;
  }
  const reply = await fetch(url, { headers, credentials: "same-origin" });
  const type = reply.headers.get("Content-Type") || "";
  if (!reply.ok || !type.includes("javascript")) {
    throw new Error(`${url.pathname} answered ${reply.status} ${type}`);
  }
  return reply.text();
}

// The kernel's copy of plotly.js, once per page: whichever model receives it (unasked, or in
// answer to a request) settles the one promise every view waits on.
function kernelCopy() {
  if (!globalThis.__jaxNbmemKernelCopy) {
    let settle = null;
    const copy = new Promise((resolve, reject) => {
      settle = { resolve, reject };
    });
    copy.catch(() => {}); // a page that never needs it does not report it
    globalThis.__jaxNbmemKernelCopy = { copy, settle, text: null };
  }
  return globalThis.__jaxNbmemKernelCopy;
}

// Listen on *model* for the kernel's copy; from the model's start, before any view, since
// the kernel sends it right after it opens the widget.
function listenForKernelCopy(model) {
  const listen = (content, buffers) => {
    if (!content || content.event !== KERNEL_REPLY) {
      return;
    }
    const shared = kernelCopy();
    if (shared.text !== null) {
      return;
    }
    if (content.error || !buffers || !buffers.length) {
      shared.settle.reject(new Error(`the kernel has no plotly.js (${content.error || "no file"})`));
      globalThis.__jaxNbmemKernelCopy = null; // a later view may ask again
      return;
    }
    shared.text = new TextDecoder().decode(buffers[0]);
    shared.settle.resolve(shared.text);
  };
  model.on("msg:custom", listen);
  return () => model.off("msg:custom", listen);
}

function fromKernel(model) {
  const shared = kernelCopy();
  if (shared.text !== null) {
    return Promise.resolve(shared.text);
  }
  model.send({ event: KERNEL_REQUEST });
  let timer = null;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error("no kernel sent plotly.js")), KERNEL_WAIT_MS);
  });
  return Promise.race([shared.copy, timeout]).finally(() => clearTimeout(timer));
}

async function loadPlotly(model) {
  const config = pageConfig();
  const reasons = [];
  // The server's copy first where there may be one: the browser keeps it for later pages.
  // Voilà has run every cell before its page asks, so its kernel answers at once; standalone
  // (`voila nb.ipynb`) it serves no jax_nbmem route, and asking there only logs a 403.
  const voila = config && config.appUrl === "voila/";
  if (config && typeof config.baseUrl === "string" && !voila) {
    try {
      const loaded = await evaluatePlotly(await fromServer(config));
      return { Plotly: loaded, source: "server" };
    } catch (error) {
      reasons.push(`server: ${error.message || error}`);
      // The kernel may take a while, or never answer (a notebook opened without one): the
      // snapshots come back into view until a plot draws.
      globalThis.__jaxNbmemNoServer = true;
      for (const style of document.querySelectorAll("style[id^='jax-nbmem-hide-']")) {
        style.remove();
      }
    }
  }
  try {
    const loaded = await evaluatePlotly(await fromKernel(model));
    return { Plotly: loaded, source: "kernel" };
  } catch (error) {
    reasons.push(`kernel: ${error.message || error}`);
  }
  throw new Error(reasons.join("; "));
}

function plotly(model) {
  // One copy per page, shared by every view of every panel; a failure lets a later view retry.
  if (!globalThis.__jaxNbmemPlotly) {
    globalThis.__jaxNbmemPlotly = loadPlotly(model).then(
      (loaded) => {
        globalThis.__jaxNbmemPlotlySource = loaded.source; // which way it came, for tests
        return loaded.Plotly;
      },
      (error) => {
        globalThis.__jaxNbmemPlotly = null;
        throw error;
      },
    );
  }
  return globalThis.__jaxNbmemPlotly;
}

// The static snapshot shown next to the widget is for places that cannot run it (exports, a
// notebook reopened without its kernel). Where the live plot runs, hide it.
function hideSnapshots(panelId) {
  const id = `jax-nbmem-hide-${panelId}`;
  if (!panelId || document.getElementById(id)) {
    return;
  }
  const selector = `.jax-nbmem-snapshot[data-panel="${CSS.escape(panelId)}"]`;
  const style = document.createElement("style");
  style.id = id;
  // The snapshot's picture is the output right after its words (panel.py).
  style.textContent = `${selector} { display: none !important; }
.jp-OutputArea-child:has(${selector}) { display: none !important; }
.jp-OutputArea-child:has(${selector}) + .jp-OutputArea-child { display: none !important; }`;
  document.head.appendChild(style);
}

// The page's pings and pongs, for tests (as __jaxNbmemPlotlySource says where plotly came from).
function clockCounts() {
  globalThis.__jaxNbmemClock = globalThis.__jaxNbmemClock || { pings: 0, pongs: 0 };
  return globalThis.__jaxNbmemClock;
}

// Local time as the timeline's axis writes it (24-hour).
function clockTime(date) {
  const two = (n) => String(n).padStart(2, "0");
  return `${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}`;
}

function age(ms) {
  const seconds = Math.round(ms / 1000);
  return seconds < 60 ? `${seconds} s` : `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

// Whether updates still arrive, by this page's own clock: the kernel's "Live" travels over the
// very channel that a frontend may drop, or that a busy kernel leaves silent. Any part that
// changes, and a pong, count as heard. Returns the clean-up.
function keepClock(model, el) {
  const note = document.createElement("div");
  note.className = "jax-nbmem-freshness";
  note.style.display = "none";
  el.prepend(note);
  let heard = Date.now();
  let lastPing = 0;
  let pings = 0;
  const silence = (after) =>
    Math.max(after.floorMs, after.intervals * 1000 * (model.get("update_interval_s") || 0.25));
  const look = () => {
    const live = Boolean(model.get("live"));
    const silent = Date.now() - heard;
    if (live && silent > silence(PING_AFTER) && Date.now() - lastPing > PING_EVERY_MS) {
      lastPing = Date.now();
      pings += 1;
      clockCounts().pings += 1;
      try {
        model.send({ event: PING, id: pings });
      } catch (error) {
        // no kernel to ask (a saved notebook): the silence speaks for itself
      }
    }
    const stale = live && silent > silence(STALE_AFTER);
    const panel = el.closest(".jax-nbmem-panel");
    if (panel) {
      panel.classList.toggle("jax-nbmem-stale", stale);
    }
    note.style.display = stale ? "" : "none";
    if (stale) {
      const taken = clockTime(new Date(heard));
      note.textContent =
        `Not live: nothing has arrived from the kernel for ${age(silent)}; this picture is from ${taken}. ` +
        "A cell that is still running, or a frontend that drops the panel's updates, holds them back: " +
        "run a cell to refresh it, or use %jaxmem panel cells, which updates after each cell.";
    }
  };
  const hear = () => {
    heard = Date.now();
    look();
  };
  const onMessage = (content) => {
    if (content && content.event === PONG) {
      clockCounts().pongs += 1;
      hear();
    }
  };
  const watched = [...PARTS, "live"];
  for (const part of watched) {
    model.on(`change:${part}`, hear);
  }
  model.on("msg:custom", onMessage);
  const timer = setInterval(look, CLOCK_TICK_MS);
  return () => {
    clearInterval(timer);
    for (const part of watched) {
      model.off(`change:${part}`, hear);
    }
    model.off("msg:custom", onMessage);
  };
}

function render({ model, el }) {
  const plot = document.createElement("div");
  plot.className = "jax-nbmem-plot";
  el.appendChild(plot);
  const stopClock = keepClock(model, el);
  const panelId = model.get("panel_id");
  const config = pageConfig();
  if (config && config.appUrl !== "voila/" && !globalThis.__jaxNbmemNoServer) {
    hideSnapshots(panelId); // a Jupyter page: its server has plotly.js, the plot comes at once
  }
  let Plotly = null;
  let queued = false;
  let disposed = false;

  const draw = () => {
    queued = false;
    if (disposed || !Plotly) {
      return;
    }
    // plotly writes into what it is given: hand it copies, never the model's own values.
    const data = structuredClone([...model.get("timeline"), ...model.get("cells"), ...model.get("bars")]);
    const layout = structuredClone(model.get("plot_layout"));
    Plotly.react(plot, data, layout, CONFIG);
  };
  // Several parts change in one update: draw once, on the next frame.
  const schedule = () => {
    if (!queued) {
      queued = true;
      requestAnimationFrame(draw);
    }
  };
  for (const part of PARTS) {
    model.on(`change:${part}`, schedule);
  }
  const resize = new ResizeObserver(() => {
    if (Plotly && plot.offsetParent !== null) {
      Plotly.Plots.resize(plot);
    }
  });
  resize.observe(el);

  plotly(model)
    .then((loaded) => {
      Plotly = loaded;
      hideSnapshots(panelId); // elsewhere, once it is sure to draw
      draw();
      model.send({ event: "rendered" });
    })
    .catch((error) => {
      plot.textContent = `jax_nbmem: plotly.js did not load (${error}); the snapshot below shows the panel.`;
      const style = document.getElementById(`jax-nbmem-hide-${panelId}`);
      if (style) {
        style.remove();
      }
    });

  return () => {
    disposed = true;
    stopClock();
    for (const part of PARTS) {
      model.off(`change:${part}`, schedule);
    }
    resize.disconnect();
    if (Plotly) {
      Plotly.purge(plot);
    }
  };
}

function initialize({ model }) {
  return listenForKernelCopy(model);
}

export default { initialize, render };
