"""%jaxalloc in real IPython shells, each in a fresh process (JAX's backend starts only once)."""

import importlib.metadata
import json

from jax_nbmem.allocator.extras import (
    CLIENT_OPTIONS_DICT_SINCE,
    CLIENT_OPTIONS_SINCE,
    VMM_OVERRIDE_SINCE,
)
from jax_nbmem.allocator.jaxlib import installed_jaxlib
from tests.ipython_session import run_cells

# The fraction variable the installed jaxlib reads (the deprecated name before 0.4.33).
FRACTION_NAME = installed_jaxlib().fraction_variable
_JAX = tuple(int(part) for part in importlib.metadata.version("jax").split(".")[:3])

ENV_DUMP = (
    "import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('XLA_')}))"
)
NOT_STARTED = (
    "import sys; print('jax' in sys.modules, "
    "'jax' in sys.modules and sys.modules['jax._src.xla_bridge'].backends_are_initialized())"
)


def _env_after(output):
    return json.loads(output.stdout.strip().splitlines()[-1])


def test_every_form_sets_the_variables_and_reports_them():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxalloc off",
            ENV_DUMP,
            "%jaxalloc fraction 0.3",
            ENV_DUMP,
            "%jaxalloc platform",
            ENV_DUMP,
            "%jaxalloc on",
            ENV_DUMP,
            "%jaxalloc cuda_async",
            "%jaxalloc",
        ]
    )
    assert all(o.error is None for o in out), [o.error_text for o in out]
    assert "allocator mode 'off'" in out[1].stdout
    assert _env_after(out[2]) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert _env_after(out[4]) == {FRACTION_NAME: "0.3"}
    assert _env_after(out[6]) == {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    assert _env_after(out[8]) == {}
    report = out[10].stdout
    assert "requested:   cuda_async" in report
    assert "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async  (set by jax_nbmem)" in report
    assert "backend:     not started" in report
    assert "jaxlib 0.10" in report or "jaxlib " in report


def test_bad_input_is_a_usage_error_and_leaves_the_environment_exactly_as_it_was():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxalloc fraction 0.5",
            ENV_DUMP,
            "%jaxalloc fraction 1.7",
            "%jaxalloc bogus",
            "%jaxalloc off extra",
            "%jaxalloc --frobnicate",
            ENV_DUMP,
        ]
    )
    before, after = _env_after(out[2]), _env_after(out[7])
    assert before == after == {FRACTION_NAME: "0.5"}
    for bad in out[3:7]:
        # UsageError is shown as a one-line message, not a traceback.
        assert "UsageError" in bad.text
        assert "Traceback" not in bad.text
    assert "valid modes: on, off, fraction F, " in out[3].text
    assert "unknown mode 'bogus'" in out[4].text
    assert "unexpected arguments" in out[5].text


def test_variables_set_by_hand_are_reported_and_replaced_visibly():
    out = run_cells(
        ["%load_ext jax_nbmem", "%jaxalloc", "%jaxalloc fraction 0.2", ENV_DUMP],
        env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    )
    line = next(x for x in out[1].stdout.splitlines() if "XLA_PYTHON_CLIENT_MEM_FRACTION" in x)
    assert line.endswith("(set outside jax_nbmem)")
    assert "next start:  off" in out[1].stdout
    assert "replaced XLA_PYTHON_CLIENT_MEM_FRACTION=0.9" in out[2].stdout
    # Never both fraction names: jaxlib raises ValueError when it sees both.
    assert _env_after(out[3]) == {FRACTION_NAME: "0.2"}


def test_loading_and_every_magic_leave_jax_unimported_and_its_backend_down():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxalloc",
            "%jaxalloc off",
            "%jaxalloc?",
            NOT_STARTED,
            "import jax",
            "%jaxalloc platform",
            "%jaxalloc",
            NOT_STARTED,
        ]
    )
    assert out[4].stdout.split() == ["False", "False"]
    assert "%jaxalloc [MODE]" in out[3].text
    assert out[8].stdout.split() == ["True", "False"]
    assert "backend:     not started" in out[7].stdout


def test_too_late_says_what_is_in_effect_and_how_to_get_the_mode():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxalloc fraction 0.4",
            "import jax.numpy as jnp; x = jnp.ones(3)",
            "%jaxalloc off",
            ENV_DUMP,
            "%jaxalloc",
        ]
    )
    late = out[3].stdout
    # A terminal IPython session: no kernel to restart, no notebook cell, no kernelspec.
    assert "'off' cannot take effect in this IPython session" in late
    assert "started in cell [3] on cpu with: fraction 0.4" in late
    assert "start IPython again" in late and "JAX_NBMEM_ALLOCATOR='off' ipython" in late
    assert "kernel" not in late.replace("kernel install", "")
    assert "notebook" not in late
    assert "Nothing was changed" in late
    assert _env_after(out[4]) == {FRACTION_NAME: "0.4"}
    assert "started in cell [3] on cpu with: fraction 0.4" in out[5].stdout
    assert "allocator settings do not apply to the CPU" in out[5].stdout


def test_a_change_inside_the_cell_that_starts_jax_is_reported_as_inexact():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "import os, jax.numpy as jnp; os.environ['XLA_PYTHON_CLIENT_PREALLOCATE']='false'; "
            "jnp.ones(1); os.environ['XLA_PYTHON_CLIENT_PREALLOCATE']='true'",
            "%jaxalloc",
        ]
    )
    assert "they were changed in the cell that started it, so JAX may have read others" in (
        out[2].stdout
    )


# This process's beacon once it says JAX started (the beacon thread writes within a second).
BEACON_SAYS = (
    "import json, os, time\n"
    "name = f'jax_nbmem-beacon-{os.getpid()}.json'\n"
    "path = os.path.join(os.environ['JUPYTER_RUNTIME_DIR'], name)\n"
    "for _ in range(300):\n"
    "    facts = json.load(open(path)) if os.path.exists(path) else {}\n"
    "    if facts.get('mode_in_effect'): break\n"
    "    time.sleep(0.1)\n"
    "print(json.dumps({k: facts.get(k) for k in ('mode_in_effect', 'variables')}))"
)


def test_a_mode_set_in_the_cell_that_starts_jax_is_what_jax_started_with():
    # The extension loaded earlier (as a kernelspec or config loads it), then one cell that
    # chooses the mode and starts JAX: the variables changed during that cell, by jax_nbmem,
    # before the backend started.
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxalloc off\nimport jax.numpy as jnp\njnp.ones(1)",
            "%jaxalloc",
            BEACON_SAYS,
        ]
    )
    assert all(o.error is None for o in out), [o.error_text for o in out]
    report = out[2].stdout
    assert "started in cell [2] on cpu with: off" in report
    assert "may have" not in report and "only a new kernel" not in report
    assert json.loads(out[3].stdout.strip().splitlines()[-1]) == {
        "mode_in_effect": "off",
        "variables": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    }
    # Loaded in that same cell too: still exact.
    out = run_cells(
        ["%load_ext jax_nbmem\n%jaxalloc fraction 0.3\nimport jax.numpy as jnp\njnp.ones(1)",
         "%jaxalloc"]
    )  # fmt: skip
    assert "started in cell [1] on cpu with: fraction 0.3" in out[1].stdout
    assert "may have" not in out[1].stdout


def test_extension_loaded_after_jax_started_says_so():
    out = run_cells(["import jax.numpy as jnp; jnp.zeros(2)", "%load_ext jax_nbmem", "%jaxalloc"])
    assert "before jax_nbmem loaded" in out[2].stdout


def test_syntax_errors_and_failing_cells_do_not_disturb_the_extension():
    out = run_cells(
        ["%load_ext jax_nbmem", "def broken(:", "1/0", "%jaxalloc off", "print('still fine')"]
    )
    assert out[1].error == "SyntaxError"
    assert out[2].error == "ZeroDivisionError"
    assert out[3].error is None and out[4].stdout.strip() == "still fine"
    # A callback that raises would print a traceback after every cell; none here.
    assert "jax_nbmem" not in out[4].stderr


def test_compare_cell_magic_runs_each_mode_and_rejects_misuse():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%%jaxalloc compare on off\nimport jax.numpy as jnp\nprint(float(jnp.ones(8).sum()))",
            "%%jaxalloc compare bogus\nx = 1",
            "%jaxalloc compare",
            "%%jaxalloc off\nx = 1",
            NOT_STARTED,
        ]
    )
    table = out[1].stdout
    assert out[1].error is None, out[1].text
    assert "on: ok" in table and "off: ok" in table
    assert "No GPU: allocator modes do not apply on the CPU" in table
    assert "UsageError" in out[2].text and "unknown mode 'bogus'" in out[2].text
    assert "UsageError" in out[3].text and "cell magic" in out[3].text
    assert "UsageError" in out[4].text
    # The modes ran in subprocesses: this kernel never imported jax.
    assert out[5].stdout.split() == ["False", "False"]


def test_after_clear_backends_a_new_mode_still_needs_a_restart():
    clear = (
        "import jax\n"
        "try:\n"
        "    from jax.extend.backend import clear_backends\n"
        "except ImportError:  # older JAX\n"
        "    clear_backends = jax.clear_backends\n"
        "clear_backends()"
    )
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "import jax.numpy as jnp; x = jnp.ones(3)",
            clear,
            "import jax._src.xla_bridge as xb; print(xb.backends_are_initialized())",
            "%jaxalloc",
            "%jaxalloc off",
        ]
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    assert out[3].stdout.strip() == "False"  # JAX's table is empty again
    assert "torn down by jax.extend.backend.clear_backends()" in out[4].stdout
    assert "never the environment again" in out[4].stdout
    assert "a new mode still needs a restart" in out[4].stdout
    assert "cannot take effect in this IPython session" in out[5].stdout


def test_help_texts_name_the_modes_one_way_and_the_settings_are_listed():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "print(get_ipython().find_line_magic('jaxalloc').__doc__)",
            "print(get_ipython().find_line_magic('jaxmem').__doc__)",
            "%config JaxNbMem",
            "%config JaxNbMem.panel = 'text'",
            "print(get_ipython().config.JaxNbMem.panel)",
        ]
    )
    jaxalloc, jaxmem = out[1].stdout, out[2].stdout
    assert jaxalloc.startswith("%jaxalloc [MODE]: choose JAX's GPU allocator mode")
    assert "::" not in jaxalloc and "::" not in jaxmem
    forms = ", ".join(["on", "off", "fraction F", "auto", *installed_jaxlib().allocators])
    assert f"MODE, one of {forms}:" in jaxalloc
    assert " | " not in jaxalloc
    # --timeout belongs to the cell magic only, and says so.
    assert "%jaxalloc [--timeout" not in jaxalloc
    assert "%%jaxalloc compare [MODES...] [--timeout S]" in jaxalloc
    assert "Run it at the start of the session" in jaxalloc  # a terminal, not a notebook
    assert jaxmem.startswith("%jaxmem [COMMAND]: GPU memory of this IPython session")
    for setting in ("JaxNbMem.allocator", "JaxNbMem.panel", "JaxNbMem.share_dir"):
        assert setting in out[3].stdout
    assert out[5].stdout.strip() == "text"


def test_the_help_is_written_when_first_asked_for_and_is_the_same_text():
    """%load_ext does not read jaxlib for the help; %jaxalloc? then shows it, whole."""
    out = run_cells(
        [
            "import jax_nbmem.allocator.modes as modes\n"
            "reads, _read = [], modes.installed_jaxlib\n"
            "modes.installed_jaxlib = lambda: reads.append(1) or _read()",
            "%load_ext jax_nbmem",
            "print(len(reads))",
            "%jaxalloc?",
            "print(len(reads) > 0)",
            "from jax_nbmem.notebook.help_texts import help_texts\n"
            "ip = get_ipython()\n"
            "print(ip.find_line_magic('jaxalloc').__doc__ == help_texts(False)['jaxalloc'],"
            " ip.find_cell_magic('jaxalloc').__doc__ == help_texts(False)['jaxalloc'],"
            " ip.find_line_magic('jaxmem').__doc__ == help_texts(False)['jaxmem'])",
            "%jaxalloc off",
        ]
    )
    assert out[2].stdout.strip() == "0"
    assert "%jaxalloc [MODE]: choose JAX's GPU allocator mode" in out[3].text
    assert "MODE, one of on, off, fraction F, auto" in out[3].text
    assert out[4].stdout.strip() == "True"
    assert out[5].stdout.split() == ["True", "True", "True"]
    assert "off" in out[6].text  # the magic itself runs as before


def test_jaxalloc_says_what_else_decides_the_pool_and_what_overrides_the_mode():
    env = {
        "JAX_PJRT_CLIENT_CREATE_OPTIONS": "preallocate:false",
        "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "512",
        "XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=SKIP_TEMP",
    }
    out = run_cells(["%load_ext jax_nbmem", "%jaxalloc off", "%jaxalloc"], env=env)
    applied, report = out[1].stdout, out[2].stdout
    assert "also read:   XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB=512" in report
    if _JAX < CLIENT_OPTIONS_SINCE:  # the option does not exist: nothing is said of it
        assert "jax_pjrt_client_create_options" not in applied
        return
    # The string form keeps "false" a string: the CUDA plugin's type check refuses it.
    assert "But: jax_pjrt_client_create_options breaks the GPU backend" in applied
    assert "wants a bool for preallocate" in applied
    assert "JAX_PJRT_CLIENT_CREATE_OPTIONS=preallocate:false" in report


def test_a_typed_option_overrides_the_mode_and_xla_flags_forces_vmm():
    cells = [
        "%load_ext jax_nbmem",
        "import jax\njax.config.update('jax_pjrt_client_create_options', {'allocator': 'bfc'})",
        "%jaxalloc platform",
    ]
    env = {"XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=SKIP_TEMP"}
    applied = run_cells(cells, env=env)[2].stdout
    if _JAX < CLIENT_OPTIONS_DICT_SINCE:  # no such option, or only its string form: not said
        assert "overrides allocator='bfc'" not in applied
    else:
        assert "But: jax_pjrt_client_create_options overrides allocator='bfc'" in applied
    if _JAX < VMM_OVERRIDE_SINCE:  # that jaxlib's plugin does not force vmm
        assert "will run vmm" not in applied
    else:
        assert "so the CUDA plugin will run vmm, not bfc" in applied
