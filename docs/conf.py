project = "jax_nbmem"
extensions = ["myst_parser"]
myst_heading_anchors = 4
exclude_patterns = ["_build", "jupyterhub_config.py"]
