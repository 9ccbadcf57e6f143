#!/usr/bin/env bash
# Run the product: the quickstart notebook in JupyterLab, with jax_nbmem loaded by its first cell.
#   bash scripts/quickstart.sh                  # your real GPU (or, without one, an honest "no GPU")
#   bash scripts/quickstart.sh --simulated-gpu  # a simulated GPU, clearly labelled as such, with
#                                               # a neighbour on it that blocks it
# Other arguments go to `jupyter lab` (e.g. --no-browser --port 8899).
# It runs a copy, build/quickstart/quickstart.ipynb (git ignores build/): notebooks/quickstart.ipynb
# stays as it is in the repository, whatever the notebook's outputs. The URLs JupyterLab prints,
# and the page it opens in a browser, open that notebook.
set -euo pipefail
cd "$(dirname "$0")/.."
# A stock Debian has python3 and no `python` until a virtual environment is active.
if ! command -v python >/dev/null 2>&1; then
    echo "quickstart.sh: no \`python\` here: make and activate a virtual environment first:" >&2
    echo "  python3 -m venv .venv && source .venv/bin/activate" >&2
    exit 1
fi
# JAX_NBMEM_NO_INSTALL=1 skips the install (the test suite runs this script as it is).
[ -n "${JAX_NBMEM_NO_INSTALL:-}" ] || python -m pip install --quiet --disable-pip-version-check -e ".[lab]"
# One quickstart at a time in a checkout: a second would overwrite the copy the first one's
# server has open (and start a second neighbour). The lock is held on descriptor 9, which
# `exec` hands to JupyterLab: it lasts as long as the first one runs, however it ends.
mkdir -p build/quickstart build/.quickstart  # the copy; the run's own files, out of its view
exec 9>>build/.quickstart/running.lock
locked=0
python -c 'import fcntl, sys
try:
    fcntl.flock(9, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)' || locked=$?
if [ "$locked" != 0 ] && [ "$locked" != 3 ]; then
  echo "Could not lock build/.quickstart/running.lock (see above)." >&2
  exit 1
fi
if [ "$locked" = 3 ]; then
  python - <<'SAY' >&2
from pathlib import Path
recorded = Path("build/.quickstart/running.pid")
pid = recorded.read_text().strip() if recorded.exists() else "?"
url = None
try:
    from jupyter_server.serverapp import list_running_servers
    url = next((s["url"] for s in list_running_servers() if str(s.get("pid")) == pid), None)
except Exception:  # an older jupyter_server, a runtime folder of another user: say the PID alone
    pass
where = f"at {url}lab/tree/quickstart.ipynb" if url else "(`jupyter server list` shows where)"
print(
    f"A quickstart already runs from this checkout: JupyterLab, PID {pid}, {where}, serving "
    "build/quickstart/quickstart.ipynb. Open that one, or stop it (Ctrl-C in its terminal, "
    f"or kill {pid}) and run this again."
)
SAY
  exit 1
fi
echo $$ > build/.quickstart/running.pid  # this PID becomes JupyterLab's (exec, below)
# `python -m build` in this checkout, without the `build` package installed, finds this build/
# folder instead (a folder without __init__.py is a namespace package) and fails with "No
# module named build.__main__". This file makes that failure say why; with the package
# installed, its regular package wins over the folder and nothing changes.
cat > build/__main__.py <<'PY'
import sys

sys.exit(
    "python -m build found this checkout's build/ folder (the quickstart's and the docs' "
    "output), not the `build` package, which is not installed here: run `pip install build`, "
    "then `python -m build` again (docs/getting-started.md, \"Make a wheel\")."
)
PY
simulated=""
args=()
for arg in "$@"; do
  if [ "$arg" = "--simulated-gpu" ]; then
    simulated=1
  else
    args+=("$arg")
  fi
done
if [ -n "$simulated" ]; then
  # One folder per user (jax_nbmem-simgpu-UID in the temporary directory). --kernels: each
  # kernel's JAX arrays land on the simulated GPU as JAX's allocator would hold them (JAX
  # itself runs on the CPU here); see jax_nbmem/simgpu/mirror.py.
  eval "$(python -m jax_nbmem.simgpu shell-env --kernels)"
  echo "Simulated GPU: state file $JAX_NBMEM_SIMGPU_STATE (JAX runs on the CPU; its arrays are mirrored)"
  # A terminal of the user's own has neither variable: without this line its `jax-nbmem
  # status` says "no NVIDIA driver" where the notebook says it prints the same.
  echo "In another terminal, this line makes \`jax-nbmem status\` see the simulated GPU:"
  printf '  export LD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} JAX_NBMEM_SIMGPU_STATE=%q\n' \
    "${LD_LIBRARY_PATH%%:*}" "$JAX_NBMEM_SIMGPU_STATE"
  # The neighbour the product is for: someone else's idle kernel whose JAX preallocated 75% of
  # the GPU. A real kernel, started here rather than by the notebook (whose cells are the same
  # on a real GPU); it ends with this script (--stop-with: this PID, which `exec` hands to
  # JupyterLab), or when the panel's button shuts it down.
  echo "Starting a neighbour on it: an idle kernel of neighbour.ipynb whose JAX preallocated..."
  python -m jax_nbmem.simgpu tenant --notebook neighbour.ipynb --stop-with $$ \
    || echo "No neighbour (see above); the quickstart runs without one."
fi
cp notebooks/quickstart.ipynb build/quickstart/quickstart.ipynb
echo "Running a copy: build/quickstart/quickstart.ipynb"
# No "official Jupyter news?" pop-up over the panel: the quickstart's own Jupyter config folder
# gives JupyterLab's news setting the default "never" (a user's own setting still wins).
mkdir -p build/.quickstart/jupyter-config/labconfig
printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}' \
  > build/.quickstart/jupyter-config/labconfig/default_setting_overrides.json
export JUPYTER_CONFIG_PATH="$PWD/build/.quickstart/jupyter-config${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
# The notebook, not the Launcher, at every URL JupyterLab prints (and at / too).
args=("--LabApp.default_url=/lab/tree/quickstart.ipynb" ${args[@]+"${args[@]}"})
# Jupyter refuses to run as root unless told; containers and cloud boxes often are root.
[ "$(id -u)" = "0" ] && args+=("--allow-root")
exec python -m jupyter lab build/quickstart/quickstart.ipynb "${args[@]}"
