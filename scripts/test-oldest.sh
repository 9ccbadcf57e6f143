#!/usr/bin/env bash
# The allocator, kernel-start and JAX-facing tests (fit, what errors leave, track among them)
# again, under the oldest JAX jax_nbmem supports (0.4.26, whose xla_client.py reads only the
# deprecated fraction name) and the floors of the dependencies it declares, in a virtual
# environment of their own. CI runs it after scripts/test.sh; it needs no GPU, only the
# package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${JAX_NBMEM_OLDEST_VENV:-${TMPDIR:-/tmp}/jax_nbmem-oldest-$(id -u)}"
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# numpy 2 came after jaxlib 0.4.26, which was built against numpy 1.
"${pip[@]}" "jax==0.4.26" "jaxlib==0.4.26" "numpy<2" "scipy<1.14"
"${pip[@]}" -e . "pytest>=7.4" "pytest-timeout>=2.1" \
    "ipython==8.0.0" "ipywidgets==8.0.0" "anywidget==0.9.0" "plotly==5.24.1" \
    "nvidia-ml-py==12.535.108"
"$venv/bin/python" -c "import jax, jaxlib; print('oldest: jax', jax.__version__, 'jaxlib', jaxlib.__version__)"
# As if activated: IPython puts $VIRTUAL_ENV's packages first on sys.path, so a virtualenv
# active around this script (CI's own) would otherwise lend its newer JAX to the shells here.
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
# tests/skips.py: under CI, only this run's listed skips (the extras it does not install) pass.
export JAX_NBMEM_FLOORS=oldest
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@" \
    tests/allocator tests/cli tests/gpu tests/notebook/test_settings.py \
    tests/notebook/test_jaxalloc_magic.py tests/notebook/test_panel_kernel.py tests/notebook/test_figure.py \
    tests/notebook/test_panel_view.py \
    tests/tools/test_fit.py tests/tools/test_last_error.py tests/tools/test_track.py tests/record/test_export.py
