# A package, so that tests import shared helpers as `tests.jupyterlab` and the helper module
# never shadows the real `jupyterlab` package on sys.path.
