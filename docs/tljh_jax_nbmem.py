# /opt/tljh/config/jupyterhub_config.d/jax_nbmem.py: jax_nbmem on The Littlest JupyterHub.
# TLJH loads this after its own settings; `sudo tljh-config reload hub` applies it.
import os

c = get_config()  # noqa: F821 (JupyterHub defines get_config)

# Every user's kernels and servers write and read their beacons here (once, as root:
# `install -d -m 1777 /var/tmp/jax_nbmem`). TLJH's users' units share the host's /var/tmp.
c.Spawner.environment.update({"JAX_NBMEM_SHARE_DIR": "/var/tmp/jax_nbmem"})

# The culler's token, which its own systemd unit also reads (jax-nbmem-culler.service): the
# hub does not start the culler, since TLJH's hub unit hides the GPUs (PrivateDevices=yes)
# and the host's /var/tmp (PrivateTmp=yes) from what it starts.
CULLER_ENV = os.environ.get("JAX_NBMEM_CULLER_ENV", "/etc/jax_nbmem/culler.env")
with open(CULLER_ENV) as env:  # one line, JUPYTERHUB_API_TOKEN=<openssl rand -hex 32>
    token = env.read().strip().partition("=")[2]

c.JupyterHub.services.append({"name": "jax-nbmem-culler", "api_token": token})
c.JupyterHub.load_roles.append(
    {
        "name": "jax-nbmem-culler",
        # Find a user's server, and have the hub issue a token for that one server to stop
        # one kernel (never the whole server); admin:server_state: the spawner's record of
        # each server (its systemd unit), which proves whose a kernel is where Unix user
        # jupyter-alice is hub user alice.
        "scopes": ["read:servers", "tokens", "admin:server_state"],
        "services": ["jax-nbmem-culler"],
    }
)
