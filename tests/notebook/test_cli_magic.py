"""`jax-nbmem` in a cell after JAX started: no fork warning from JAX, the user's own `!` untouched.

JAX warns on every `os.fork()` once its backend started; IPython's `!cmd` forks through a pty
for any command. `%jaxnbmem ARGS`, and `!jax-nbmem ARGS` of plain words while the extension
is loaded, run the command through `subprocess`, which runs no at-fork hook.
"""

from __future__ import annotations

import importlib

import pytest

from tests.kernels import execute, running_kernel

FORK_WARNING = "os.fork() was called"
# JAX's at-fork hook (jax/_src/xla_bridge.py's _at_fork, registered when its backend starts);
# a JAX without one never warns, and then neither path may.
JAX_WARNS = hasattr(importlib.import_module("jax._src.xla_bridge"), "_at_fork")

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(240)]


def test_jax_warns_on_any_bang_command_once_its_backend_started():
    """The cause, as a user meets it without the extension: `!echo` warns as well."""
    with running_kernel(env={"JAX_PLATFORMS": "cpu"}) as (_, client):
        out, error = execute(client, "import jax\n!echo before")
        assert error is None and FORK_WARNING not in out  # JAX imported, no backend yet
        execute(client, "import jax.numpy as jnp\njnp.ones(3).block_until_ready()")
        out, error = execute(client, "!echo after")
        assert error is None and "after" in out and (FORK_WARNING in out) == JAX_WARNS, out


def test_jax_nbmem_from_a_cell_runs_without_the_fork_warning():
    with running_kernel(env={"JAX_PLATFORMS": "cpu"}) as (_, client):
        execute(
            client, "%load_ext jax_nbmem\nimport jax.numpy as jnp\njnp.ones(3).block_until_ready()"
        )
        out, error = execute(client, "!jax-nbmem kernel list\nprint('status', _exit_code)")
        assert error is None and FORK_WARNING not in out, out
        assert "kernelspecs" in out and "status 0" in out, out
        out, error = execute(client, "%jaxnbmem nonsense\nprint('status', _exit_code)")
        assert "invalid choice: 'nonsense'" in out and "status 2" in out, out
        assert error is None and FORK_WARNING not in out
        # Indented, in a loop: the same; in a string, left alone.
        code = (
            "for _ in range(2):\n    !jax-nbmem -V\n"
            "text = '''\n!jax-nbmem status\n'''\nprint(repr(text))"
        )
        out, error = execute(client, code)
        assert error is None and out.count("jax-nbmem 0") == 2, out
        assert "'\\n!jax-nbmem status\\n'" in out
        assert FORK_WARNING not in out, out
        out, error = execute(client, '%jaxnbmem status "unclosed')
        assert "UsageError: %jaxnbmem: cannot read the arguments" in out, out
        # A line a shell would expand stays IPython's; so does every other command.
        out, _ = execute(client, "print(get_ipython().transform_cell('!jax-nbmem status | head'))")
        assert "system(" in out and "run_line_magic" not in out, out
        out, _ = execute(client, "!echo mine")
        assert "mine" in out and (FORK_WARNING in out) == JAX_WARNS, out  # yours still warns
        execute(client, "%unload_ext jax_nbmem")
        out, _ = execute(client, "print(get_ipython().transform_cell('!jax-nbmem status'))")
        assert "system(" in out and "jaxnbmem" not in out, out
