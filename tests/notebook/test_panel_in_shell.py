"""The live panel's widget in a real IPython shell on the simulated GPU: what its model holds.

No frontend draws it here; we read the widgets' state as a frontend would receive it.
"""

import json

from jax_nbmem.simgpu import GIB
from tests.ipython_session import run_cells

SMALL_MIG = "MIG-11111111-2222-5333-8444-555555555555"
BIG_MIG = "MIG-66666666-7777-5888-8999-000000000000"

SHOW_WIDGET = ["%load_ext jax_nbmem", '%config JaxNbMem.panel = "widget"', "%jaxmem"]
READ_SELECTOR = """\
import json, jax_nbmem.notebook.magics as magics
live = magics.session_of(get_ipython())._panel_state.live
live.update()
state = live.gpu_selector.get_state()
print(json.dumps({"labels": state["_options_labels"], "index": state["index"],
                  "width": live.gpu_selector.layout.width,
                  "shown": live.gpu_selector.layout.display != "none"}))
"""


def split_gpu(state):
    """GPU 0 split into instances 1 (1g.18gb) and 2 (3g.71gb), and a whole GPU 1."""
    state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    state.mig(0, 1, 18 * GIB, uuid=SMALL_MIG, name="NVIDIA H200 MIG 1g.18gb")
    state.mig(0, 2, 71 * GIB, uuid=BIG_MIG, name="NVIDIA H200 MIG 3g.71gb")
    return state.process(0, 4001, 5 * GIB, mig=1).write()


def _selector(env):
    out = run_cells([*SHOW_WIDGET, READ_SELECTOR], env=env)
    assert [cell.error for cell in out] == [None] * len(out), out[-1].text
    return json.loads(out[-1].stdout)


def test_the_gpu_selector_names_mig_instances_after_the_gpu_they_split(sim_state, simgpu_env):
    split_gpu(sim_state)
    seen = _selector(simgpu_env)  # every GPU: CUDA_VISIBLE_DEVICES unset
    # As the status lists them: GPU 0's instances, then GPU 1; the split GPU has no memory of
    # its own to draw. The first is chosen.
    assert seen["labels"] == [
        "MIG 1g.18gb instance 1 of GPU 0",
        "MIG 3g.71gb instance 2 of GPU 0",
        "GPU 1",
    ]
    assert seen["index"] == 0 and seen["shown"]
    # The whole name fits beside the "GPU" description (about 8 px a character).
    assert int(seen["width"].removesuffix("px")) >= 90 + 8 * len("MIG 3g.71gb instance 2 of GPU 0")


def test_a_kernel_on_one_instance_has_that_instance_alone(sim_state, simgpu_env):
    split_gpu(sim_state)
    seen = _selector({**simgpu_env, "CUDA_VISIBLE_DEVICES": BIG_MIG})
    assert seen["labels"] == ["MIG 3g.71gb instance 2 of GPU 0"]
    assert not seen["shown"]  # one GPU: nothing to choose


def test_the_panel_kind_is_part_of_the_magics_grammar(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxmem panel sideways",
            "%jaxmem panel text cells",
            "import jax_nbmem.notebook.magics as magics\n"
            "print(getattr(magics.session_of(get_ipython()), '_panel_state', None))",
            "%jaxmem panel text",
        ],
        env=simgpu_env,
    )
    for wrong in out[1:3]:  # refused, with the valid forms
        assert wrong.error == "UsageError", wrong.text
        assert "is not one of auto, widget, cells, static, text" in wrong.error_text
        assert "panel [auto | widget | cells | static | text]" in wrong.error_text
    assert out[3].stdout.strip() == "None"  # nothing was shown or changed
    # In a terminal the text is printed once: it says when, and never that it is live.
    assert out[4].error is None, out[4].text
    assert "GPU 0: NVIDIA H200 (simulated)" in out[4].stdout
    assert "run `%jaxmem` again for a new look" in out[4].stdout
    assert "Live" not in out[4].stdout
