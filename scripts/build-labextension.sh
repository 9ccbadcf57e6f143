#!/usr/bin/env bash
# Rebuild the JupyterLab extension from labextension/ into jax_nbmem/labextension/ (the prebuilt
# extension the wheel installs), then write labextension/build-stamp.json: the hashes of the
# sources and of what was built from them. tests/labextension/test_build.py fails when either
# changed without the other, so that the built files checked into git are always those of the
# sources. Needs node >= 18 and npm (Debian's `nodejs npm`, or nodejs.org) and the npm registry;
# `pip install` and JupyterLab need neither.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here/labextension"
python="${PYTHON:-python}"
npm ci --no-audit --no-fund
npx tsc
# The shared packages' versions come from the JupyterLab installed here (its staging folder).
core="$("$python" -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')"
rm -rf "$here/jax_nbmem/labextension"
node node_modules/@jupyterlab/builder/lib/build-labextension.js --core-path "$core" .
"$python" "$here/scripts/labextension_stamp.py" write
echo "built $here/jax_nbmem/labextension; stamp in labextension/build-stamp.json"
