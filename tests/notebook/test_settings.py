"""A mode from the settings at kernel start: IPython config, $JAX_NBMEM_ALLOCATOR, reloads."""

import pytest

from tests.ipython_session import run_cells
from tests.kernels import execute, running_kernel

pytestmark = pytest.mark.kernel


def test_ipython_kernel_config_loads_the_extension_with_its_mode(tmp_path):
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["jax_nbmem"]\nc.JaxNbMem.allocator = "platform"\n'
    )
    with running_kernel(env={"IPYTHONDIR": str(tmp_path / "ipython")}) as (_, client):
        report, error = execute(client, "%jaxalloc")
        assert error is None, report
        assert "requested:   platform" in report
        assert "[from c.JaxNbMem.allocator]" in report


def test_environment_variable_wins_over_config_and_bad_values_are_explained():
    out = run_cells(
        [
            "get_ipython().config.JaxNbMem.allocator = 'platform'",
            "%load_ext jax_nbmem",
            "%jaxalloc",
        ],
        env={"JAX_NBMEM_ALLOCATOR": "off"},
    )
    assert "requested:   off" in out[2].stdout and "$JAX_NBMEM_ALLOCATOR" in out[2].stdout
    bad = run_cells(["%load_ext jax_nbmem", "%jaxalloc"], env={"JAX_NBMEM_ALLOCATOR": "fast"})
    assert "ignoring allocator mode 'fast' from $JAX_NBMEM_ALLOCATOR" in bad[0].stdout
    assert "requested:   nothing" in bad[1].stdout


def test_unload_and_reload_leave_no_hooks_and_reread_the_config():
    count = (
        "ev = get_ipython().events.callbacks; "
        "print(len(ev['pre_run_cell']), len(ev['post_run_cell']))"
    )
    out = run_cells(
        [
            count,
            "%load_ext jax_nbmem",
            count,
            "get_ipython().config.JaxNbMem.allocator = 'fraction 0.6'",
            "%reload_ext jax_nbmem",
            count,
            "%jaxalloc",
            "%unload_ext jax_nbmem",
            count,
            "%jaxalloc off",
        ]
    )
    base = out[0].stdout.split()
    loaded = out[2].stdout.split()
    assert [int(n) for n in loaded] == [int(n) + 1 for n in base]
    assert out[5].stdout.split() == loaded
    assert "requested:   fraction 0.6" in out[6].stdout
    assert out[8].stdout.split() == base
    assert "UsageError" in out[9].text and "jaxalloc" in out[9].text
