// The panel's plot: draws the figure parts the kernel syncs (timeline, cells, bars, layout)
// with plotly.js. Every view reads the model's current state, so a second view, or one made
// after a page reload, draws the same picture as the first and follows the same updates.
// PLOTLY_SOURCE is put in front of this file by jax_nbmem/notebook/panel_view.py: the
// plotly.js that the installed plotly package ships, so nothing is fetched from a CDN.

const PARTS = ["timeline", "cells", "bars", "plot_layout"];
const CONFIG = { displaylogo: false, responsive: true };

// plotly.min.js is a UMD bundle. Run as a function with a local `module`, it hands its export
// over whatever loaders the page has (an AMD `define` would otherwise take it). A Function
// body is not strict, as the older bundles expect; where a page forbids eval, an ES module
// made from the same text is the fallback.
function evaluatePlotly() {
  const module = { exports: {} };
  try {
    new Function("module", "exports", PLOTLY_SOURCE).call(globalThis, module, module.exports);
    return Promise.resolve(module.exports);
  } catch (error) {
    const text = `const module = { exports: {} }; const exports = module.exports;\n${PLOTLY_SOURCE}\nexport default module.exports;`;
    const url = URL.createObjectURL(new Blob([text], { type: "text/javascript" }));
    return import(url).then((loaded) => loaded.default).finally(() => URL.revokeObjectURL(url));
  }
}

function plotly() {
  // One copy per page, shared by every view of every panel.
  if (!globalThis.__jaxNbmemPlotly) {
    globalThis.__jaxNbmemPlotly = evaluatePlotly();
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
  style.textContent = `${selector} { display: none !important; }
.jp-OutputArea-child:has(${selector}) { display: none !important; }`;
  document.head.appendChild(style);
}

function render({ model, el }) {
  const plot = document.createElement("div");
  plot.className = "jax-nbmem-plot";
  el.appendChild(plot);
  hideSnapshots(model.get("panel_id"));
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

  plotly()
    .then((loaded) => {
      Plotly = loaded;
      draw();
      model.send({ event: "rendered" });
    })
    .catch((error) => {
      plot.textContent = `jax_nbmem: plotly.js did not load (${error}); the snapshot below shows the panel.`;
      const style = document.getElementById(`jax-nbmem-hide-${model.get("panel_id")}`);
      if (style) {
        style.remove();
      }
    });

  return () => {
    disposed = true;
    for (const part of PARTS) {
      model.off(`change:${part}`, schedule);
    }
    resize.disconnect();
    if (Plotly) {
      Plotly.purge(plot);
    }
  };
}

export default { render };
