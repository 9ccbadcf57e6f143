# jupyterhub_config.py: a shared GPU node under JupyterHub, with jax_nbmem (LocalProcessSpawner).
# The suite's hub tests (tests/hub/) run exactly this file, with their ports, users and paths.
import os
import sys

from jupyterhub.auth import Authenticator

c = get_config()  # noqa: F821 (JupyterHub defines get_config)

# The hub's public address (its proxy), as users open it.
HUB_URL = os.environ.get("JAX_NBMEM_HUB_URL", "http://127.0.0.1:8000")
# Every user's kernels and servers write and read their beacons here (once, as root:
# `install -d -m 1777 /var/tmp/jax_nbmem`: sticky, so nobody replaces another's file).
SHARE_DIR = os.environ.get("JAX_NBMEM_SHARE_DIR", "/var/tmp/jax_nbmem")

c.JupyterHub.bind_url = HUB_URL
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"

# Who may log in. JupyterHub 5 and later let nobody in until this is said; 4.x let in everyone
# the authenticator accepts. Here, as 4.x did: every Unix account PAM (the default
# authenticator) accepts, the same people who may log in to this machine anyway. To name them
# instead, replace these two lines with: c.Authenticator.allowed_users = {"alice", "bob"}
if hasattr(Authenticator, "allow_all"):  # JupyterHub >= 5 (4.x has no such setting)
    c.Authenticator.allow_all = True

# The kernels *and* the server extension (board, API, /metrics) read the share directory.
c.Spawner.environment = {"JAX_NBMEM_SHARE_DIR": SHARE_DIR}
# The spawner passes on only these of the hub's environment: LD_LIBRARY_PATH (where NVML and
# CUDA are found) and CUDA_VISIBLE_DEVICES are not among JupyterHub's defaults.
c.Spawner.env_keep = [
    "PATH", "PYTHONPATH", "CONDA_ROOT", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV", "LANG", "LC_ALL",
    "JUPYTERHUB_SINGLEUSER_APP", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
]  # fmt: skip

# GPU-aware idle culling (off until this service is configured): a kernel idle for more than
# --idle seconds that holds a preallocated pool on a GPU where someone else is short of memory
# is warned in its own panel, then shut down through its server --warn seconds later unless it
# runs a cell. Remove --dry-run once its log shows the kernels you expect.
c.JupyterHub.services = [
    {
        "name": "jax-nbmem-culler",
        "command": [
            sys.executable, "-m", "jax_nbmem.cli", "cull",
            "--hub-url", HUB_URL, "--share-dir", SHARE_DIR,
            "--idle", "3600", "--warn", "600", "--every", "60", "--dry-run",
        ],
    },
]  # fmt: skip
c.JupyterHub.load_roles = [
    {
        "name": "jax-nbmem-culler",
        # Find a user's server, and have the hub issue a token for that one server to stop
        # one kernel (never the whole server): this token itself goes to the hub only.
        "scopes": ["read:servers", "tokens"],
        "services": ["jax-nbmem-culler"],
    },
]
