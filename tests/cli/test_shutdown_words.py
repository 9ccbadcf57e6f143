"""Issue 34: `jax-nbmem shutdown PID` and `%jaxmem shutdown PID` speak one language.

Both take `--yes` (act) and `--dry-run` (only say); both at once is a usage error in both;
each keeps its default (the command line acts, the magic only says); both help texts say the
two words in the same sentences. The kernels are stand-ins that Jupyter's command line names
(`ipykernel_launcher -f kernel-ID.json`), on the simulated GPU, stopped by signal.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jax_nbmem.cli.command import _parser, main
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.owners import SHUTDOWN_DRY_RUN, SHUTDOWN_YES
from tests.ipython_session import run_cells

pytestmark = pytest.mark.kernel


def _kernel(tmp_path, n: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "ipykernel_launcher",
         "-f", str(tmp_path / f"kernel-0a1b2c{n:02d}.json")],
    )  # fmt: skip


@pytest.fixture
def kernels(tmp_path, sim_state):
    started = [_kernel(tmp_path, n) for n in range(4)]
    state = sim_state.gpu(0, total=80 * GIB)
    for kernel in started:
        state.process(0, kernel.pid, GIB)
    state.write()
    yield started
    for kernel in started:
        kernel.kill()
        kernel.wait()


def _alive(kernel: subprocess.Popen) -> bool:
    return kernel.poll() is None


def test_the_command_line_and_the_magic_take_yes_and_dry_run_alike(
    kernels, simgpu_in_process, simgpu_env, capsys, monkeypatch
):
    for name in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JAX_NBMEM_HUB_URL"):
        monkeypatch.delenv(name, raising=False)
    a, b, c, d = kernels
    # jax-nbmem shutdown: --dry-run only says; both words at once are a usage error; --yes,
    # like no word, acts (and the JSON's done says so).
    assert main(["shutdown", str(a.pid), "--dry-run"]) == 0
    assert "Nothing done (--dry-run)" in capsys.readouterr().out and _alive(a)
    with pytest.raises(SystemExit) as usage:
        main(["shutdown", str(a.pid), "--yes", "--dry-run"])
    assert usage.value.code == 2 and "not allowed with" in capsys.readouterr().err
    assert _alive(a)
    assert main(["shutdown", str(a.pid), "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] is True
    a.wait(10)
    assert main(["shutdown", str(b.pid), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] is True
    b.wait(10)

    # %jaxmem shutdown: the same words, the same meanings; its default only says.
    dry, both, plain, yes = run_cells(
        ["%load_ext jax_nbmem\n%jaxmem shutdown " + f"{c.pid} --dry-run",
         f"%jaxmem shutdown {c.pid} --yes --dry-run",
         f"%jaxmem shutdown {d.pid}",
         f"%jaxmem shutdown {c.pid} --yes"],
        env=simgpu_env,
    )  # fmt: skip
    assert dry.error is None and f"Would shut down kernel PID {c.pid}" in dry.text, dry.text
    assert both.error == "UsageError" and "not both" in both.error_text, both
    assert plain.error is None and "Would shut down" in plain.text and _alive(d)
    assert yes.error is None and f"Stopped kernel PID {c.pid}" in yes.text, yes.text
    c.wait(10)


def test_both_help_texts_say_the_two_words_the_same_way():
    from jax_nbmem.notebook.help_texts import help_texts

    shutdown = _parser()._subparsers._group_actions[0].choices["shutdown"]
    cli = {a.option_strings[0]: a.help % {} for a in shutdown._actions if a.option_strings}
    assert (cli["--yes"], cli["--dry-run"]) == (SHUTDOWN_YES, SHUTDOWN_DRY_RUN)
    magic = help_texts(in_kernel=True)["jaxmem"]
    assert f"--yes: {SHUTDOWN_YES}" in magic and f"--dry-run: {SHUTDOWN_DRY_RUN}" in magic
    assert "shutdown PID [--yes | --dry-run]" in magic
    assert "[--yes | --dry-run]" in shutdown.format_usage()
