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
# JAX_NBMEM_NO_INSTALL=1 skips the install (the test suite runs this script as it is).
[ -n "${JAX_NBMEM_NO_INSTALL:-}" ] || python -m pip install --quiet --disable-pip-version-check -e ".[lab]"
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
  # The neighbour the product is for: someone else's idle kernel whose JAX preallocated 75% of
  # the GPU. A real kernel, started here rather than by the notebook (whose cells are the same
  # on a real GPU); it ends with this script (--stop-with: this PID, which `exec` hands to
  # JupyterLab), or when the panel's button shuts it down.
  echo "Starting a neighbour on it: an idle kernel of neighbour.ipynb whose JAX preallocated..."
  python -m jax_nbmem.simgpu tenant --notebook neighbour.ipynb --stop-with $$ \
    || echo "No neighbour (see above); the quickstart runs without one."
fi
mkdir -p build/quickstart
cp notebooks/quickstart.ipynb build/quickstart/quickstart.ipynb
echo "Running a copy: build/quickstart/quickstart.ipynb"
# The notebook, not the Launcher, at every URL JupyterLab prints (and at / too).
args=("--LabApp.default_url=/lab/tree/quickstart.ipynb" ${args[@]+"${args[@]}"})
# Jupyter refuses to run as root unless told; containers and cloud boxes often are root.
[ "$(id -u)" = "0" ] && args+=("--allow-root")
exec python -m jupyter lab build/quickstart/quickstart.ipynb "${args[@]}"
