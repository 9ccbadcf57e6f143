"""How soon the panel's plot draws after Run All, with and without jax_nbmem's server extension.

    python benchmarks/panel_first_draw.py [--hold 15] [--json PATH]

JupyterLab on the simulated GPU, headless chromium (Debian's), a notebook of two cells:
``%load_ext jax_nbmem`` + ``%jaxmem``, then a cell that keeps the kernel busy for ``--hold``
seconds (the queue of a Run All). Timed in the page, from the Run All click to the first plot
with data. With the extension, plotly.js comes from the server's route; without it (as in VS
Code, Colab, Voilà), from the copy the kernel sends with its first panel. Before that copy
existed, a plot without the route waited for the kernel to be idle: the hold and more.
Run from the repository root; needs JupyterLab, Playwright and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jax_nbmem import simgpu  # noqa: E402
from jax_nbmem.simgpu import GIB, SimState  # noqa: E402
from tests.jupyterlab import chromium_page, open_notebook, start_lab, write_notebook  # noqa: E402

PLOT = ".jax-nbmem-panel .js-plotly-plot"


def first_draw_s(folder: Path, env: dict[str, str], hold_s: float, with_extension: bool) -> dict:
    """Seconds from Run All to the first drawn plot, and where plotly.js came from."""
    env = dict(env)
    if not with_extension:
        config = folder / "jupyter-config"
        config.mkdir(parents=True, exist_ok=True)
        off = {"ServerApp": {"jpserver_extensions": {"jax_nbmem.server": False}}}
        (config / "jupyter_server_config.json").write_text(json.dumps(off))
        env["JUPYTER_CONFIG_DIR"] = str(config)
    server = start_lab(folder / "notebooks", folder / "lab", env=env)
    try:
        cells = ["%load_ext jax_nbmem\n%jaxmem", f"import time\ntime.sleep({hold_s})"]
        write_notebook(server.root_dir / "bench.ipynb", cells)
        with chromium_page(folder / "profile") as page:
            open_notebook(page, server, "bench.ipynb")
            page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.click(
                position={"x": 5, "y": 5}
            )
            page.get_by_role("menuitem", name="Run", exact=True).click()
            entry = page.get_by_role("menuitem", name=re.compile(r"^Run All Cells"))
            entry.evaluate("node => { globalThis.__benchClick = performance.now(); }")
            entry.click()
            page.wait_for_function(
                """selector => {
                    const plot = document.querySelector(selector);
                    if (!plot || !plot.data || !plot.data.length) return false;
                    globalThis.__benchDrawn = globalThis.__benchDrawn || performance.now();
                    return true;
                }""",
                arg=PLOT,
                timeout=(hold_s + 120) * 1000,
                polling=50,
            )
            took = page.evaluate("() => (globalThis.__benchDrawn - globalThis.__benchClick) / 1000")
            source = page.evaluate("() => globalThis.__jaxNbmemPlotlySource || null")
        return {"first_draw_s": round(took, 2), "plotly_from": source}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=15.0, help="seconds of the held cell")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jax-nbmem-first-draw-") as tmp:
        root = Path(tmp)
        lib = simgpu.build(root / "simgpu", old_driver=False)
        state = SimState(root / "simgpu.state")
        state.gpu(0, total=80 * GIB).process(0, 4242, 20 * GIB).write()
        env = {**os.environ, **simgpu.env_for_subprocess(lib.parent, state.path)}
        env["JAX_PLATFORMS"] = "cpu"
        results = {"hold_s": args.hold}
        for name, on in (("with the server extension", True), ("without it", False)):
            results[name] = first_draw_s(root / name.replace(" ", "-"), env, args.hold, on)
            print(f"{name}: {results[name]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
