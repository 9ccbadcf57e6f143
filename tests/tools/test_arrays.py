"""`%jaxmem top` / `%jaxmem free` (jax_nbmem.tools.arrays) in real IPython shells with real JAX.

Each scenario runs in its own process (tests/ipython_session.py): whether JAX's backend has
started is process-wide, and IPython's output history must be the shell's own.
"""

import json

from tests.ipython_session import run_cells

SETUP = (
    "import json, dataclasses\nimport jax, jax.numpy as jnp\n"
    "from jax_nbmem.tools import arrays, arrays_report"
)


def last_json(output) -> dict:
    assert output.error is None, output.text
    return json.loads(output.stdout.strip().splitlines()[-1])


def test_top_names_variables_container_items_and_output_history():
    outputs = run_cells(
        [
            SETUP,
            "big = jnp.zeros((512, 1024))\n"
            "params = {'w': jnp.ones((256, 256)), 'b': jnp.ones(256)}\n"
            "batch = [jnp.ones(8), jnp.ones((64, 64))]\n"
            "alias = big\n"
            "_scratch = jnp.ones(10)\n"
            "nested = {'layer': {'w': jnp.ones(50)}}\n"
            "shown = jnp.ones(300)",
            "shown",  # displayed: IPython's output history keeps it after `del shown`
            "del shown",
            "report = arrays.top_arrays(get_ipython().user_ns, n=20)\n"
            "print(arrays_report.format_top(report))\n"
            "print(json.dumps(dataclasses.asdict(report)))",
        ]
    )
    report = last_json(outputs[-1])
    assert report["available"] is True
    by_shape = {tuple(row["shape"]): row for row in report["rows"]}
    assert by_shape[(512, 1024)]["names"] == ["big", "alias"]
    assert by_shape[(512, 1024)]["nbytes"] == 512 * 1024 * 4
    assert by_shape[(512, 1024)]["devices"] == ["cpu:0"]
    assert by_shape[(256, 256)]["names"] == ["params['w']"]
    assert by_shape[(256,)]["names"] == ["params['b']"]
    assert by_shape[(64, 64)]["names"] == ["batch[1]"]
    assert by_shape[(8,)]["names"] == ["batch[0]"]
    # Only the output history holds the displayed array: said, not counted as a name.
    assert by_shape[(300,)]["names"] == [] and by_shape[(300,)]["history"] == ["Out[3]"]
    assert report["history_only_count"] == 1 and report["history_only_bytes"] == 1200
    # Nobody names the private one or the one nested two levels down.
    assert by_shape[(10,)]["names"] == [] and by_shape[(50,)]["names"] == []
    assert report["unnamed_count"] == 2 and report["unnamed_bytes"] == 40 + 200
    # Largest first.
    sizes = [row["nbytes"] for row in report["rows"]]
    assert sizes == sorted(sizes, reverse=True)
    table = outputs[-1].stdout
    assert "big, alias" in table and "params['w']" in table and "2.00 MiB" in table
    assert "held only by IPython's output history" in table


def test_top_cuts_to_n_rows_but_counts_every_array():
    outputs = run_cells(
        [
            SETUP,
            "xs = [jnp.ones(n) for n in range(1, 8)]",
            "report = arrays.top_arrays(get_ipython().user_ns, n=3)\n"
            "print(json.dumps(dataclasses.asdict(report)))",
        ]
    )
    report = last_json(outputs[-1])
    assert [row["names"] for row in report["rows"]] == [["xs[6]"], ["xs[5]"], ["xs[4]"]]
    assert report["live_count"] == 7 and report["live_bytes"] == 4 * sum(range(1, 8))


def test_free_deletes_what_only_its_names_hold_and_keeps_the_rest():
    outputs = run_cells(
        [
            SETUP,
            "from jax_nbmem.gpu import jaxstats\n"
            "class RecordingNamespace(dict):\n"
            "    '''The user namespace, noting whether an array was deleted as its name goes.'''\n"
            "    deleted = {}\n"
            "    def __delitem__(self, name):\n"
            "        value = self[name]\n"
            "        items = value.values() if isinstance(value, dict) else [value]\n"
            "        self.deleted[name] = [a.is_deleted() for a in items]\n"
            "        super().__delitem__(name)",
            "ns = RecordingNamespace(\n"
            "    weights=jnp.ones((1000, 1000)), params={'w': jnp.ones((100, 100))},\n"
            "    shared=jnp.ones(1000), number=3)\n"
            "ns['other'] = [ns['shared']]\n"
            "before = jaxstats.live_array_bytes()",
            "report = arrays.free_names(ns, ['weights', 'params', 'shared', 'number', 'nope'])\n"
            "print(arrays_report.format_free(report))\n"
            "print(json.dumps({'report': dataclasses.asdict(report), 'left': sorted(ns),\n"
            "    'deleted': ns.deleted, 'drop': before - jaxstats.live_array_bytes(),\n"
            "    'shared_ok': float(ns['shared'].sum()), 'valid': report.any_valid}))",
        ]
    )
    seen = last_json(outputs[-1])
    outcomes = {o["name"]: o for o in seen["report"]["outcomes"]}
    assert outcomes["weights"]["status"] == "freed" and outcomes["weights"]["bytes"] == 4_000_000
    assert outcomes["params"]["status"] == "freed" and outcomes["params"]["arrays"] == 1
    # Buffers were deleted before the names went, and the live-array bytes dropped by as much.
    assert seen["deleted"] == {"weights": [True], "params": [True]}
    assert seen["drop"] == 4_000_000 + 40_000 == seen["report"]["deleted_bytes"]
    # Still held by another name: kept whole, the holder named, the array usable.
    assert outcomes["shared"]["status"] == "kept"
    assert outcomes["shared"]["held_by"] == ["other[0]"]
    assert seen["shared_ok"] == 1000.0
    assert outcomes["number"] == {**outcomes["number"], "status": "invalid"}
    assert "not a JAX array (it is a int)" in outcomes["number"]["reason"]
    assert outcomes["nope"]["reason"] == "no such name"
    assert seen["left"] == ["number", "other", "shared"]
    assert seen["valid"] is True
    text = outputs[-1].stdout
    assert "freed weights: 1 array(s), 3.81 MiB" in text
    assert "kept shared" in text and "other[0]" in text and "skipped nope: no such name" in text
    assert "sum of the deleted arrays' nbytes" in text


def test_free_keeps_arrays_held_by_output_history_or_outside_the_namespace():
    outputs = run_cells(
        [
            SETUP,
            "shown = jnp.ones(100)\n"
            "kept_in_object = jnp.ones(200)\n"
            "class Box: pass\n"
            "box = Box(); box.array = kept_in_object\n"
            "pair = {'a': jnp.ones(5)}\n"
            "box.pair = pair\n"
            "first_name = jnp.ones(7); second_name = first_name\n"
            "one_dict = {'w': jnp.ones(9)}; same_dict = one_dict; box.w = one_dict['w']\n"
            "plain = jnp.ones(300)",
            "shown",  # Out[3] now holds it
            "ns = get_ipython().user_ns\n"
            "first = arrays.free_names(ns, ['shown', 'kept_in_object', 'pair'])\n"
            "both = arrays.free_names(ns, ['first_name', 'second_name'])\n"
            "dicts = arrays.free_names(ns, ['one_dict', 'same_dict'])\n"
            "second = arrays.free_names(ns, ['plain'], clear_caches=True)\n"
            "print(json.dumps({'first': [dataclasses.asdict(o) for o in first.outcomes],\n"
            "    'second': [dataclasses.asdict(o) for o in second.outcomes],\n"
            "    'cleared': second.caches_cleared,\n"
            "    'both': [o.status for o in both.outcomes], 'both_arrays': both.deleted_arrays,\n"
            "    'dicts': [o.held_by for o in dicts.outcomes],\n"
            "    'box_ok': float(box.array.sum()), 'shown_ok': float(Out[3].sum()),\n"
            "    'left': [n in ns for n in ('shown', 'kept_in_object', 'plain')]}))",
        ]
    )
    seen = last_json(outputs[-1])
    first = {o["name"]: o for o in seen["first"]}
    assert first["shown"]["status"] == "kept" and first["shown"]["held_by"][0] == "Out[3]"
    assert first["kept_in_object"]["status"] == "kept"
    assert first["kept_in_object"]["held_by"] == ["1 reference(s) from outside the namespace"]
    # A container that something outside the namespace also holds keeps its items.
    assert first["pair"]["status"] == "kept"
    assert first["pair"]["held_by"] == ["pair (a container also held from outside the namespace)"]
    # Two names for one array, freed together: nothing else holds it.
    assert seen["both"] == ["freed", "freed"] and seen["both_arrays"] == 1
    # One dict under two names holds its item once; the object holding it too is noticed.
    assert seen["dicts"] == [["1 reference(s) from outside the namespace"]] * 2
    assert seen["second"][0]["status"] == "freed" and seen["cleared"] is True
    assert seen["box_ok"] == 200.0 and seen["shown_ok"] == 100.0
    assert seen["left"] == [True, True, False]


def test_free_with_no_valid_name_says_so_for_each():
    outputs = run_cells(
        [
            SETUP,
            "x = jnp.ones(3)\nlabel = 'text'",
            "report = arrays.free_names(get_ipython().user_ns, ['missing', 'label', 'Out'])\n"
            "print(arrays_report.format_free(report))\n"
            "print(json.dumps({'valid': report.any_valid,\n"
            "    'reasons': [o.reason for o in report.outcomes]}))",
        ]
    )
    seen = last_json(outputs[-1])
    assert seen["valid"] is False
    assert seen["reasons"][0] == "no such name"
    assert "not a JAX array (it is a str)" in seen["reasons"][1]
    assert "output history" in seen["reasons"][2]


def test_before_jax_starts_top_says_so_and_leaves_the_backend_alone():
    outputs = run_cells(
        [
            "import json\nfrom jax_nbmem.tools import arrays, arrays_report",
            "print(arrays_report.format_top(arrays.top_arrays(get_ipython().user_ns)))",
            "import jax, jax._src.xla_bridge as xb",
            "report = arrays.top_arrays(get_ipython().user_ns)\n"
            "freed = arrays.free_names(get_ipython().user_ns, ['json'])\n"
            "print(arrays_report.format_top(report))\n"
            "print(json.dumps({'available': report.available, 'reason': report.reason,\n"
            "    'free': freed.outcomes[0].status, 'started': xb.backends_are_initialized()}))",
        ]
    )
    assert "JAX is not imported" in outputs[1].stdout
    seen = last_json(outputs[-1])
    assert seen["available"] is False and "not started" in seen["reason"]
    assert seen["free"] == "invalid"
    assert seen["started"] is False
    assert "No live JAX arrays to show" in outputs[-1].stdout


def test_magics_top_and_free_in_a_session():
    outputs = run_cells(
        [
            "%load_ext jax_nbmem",
            "%jaxmem top",
            "import jax.numpy as jnp\n"
            "weights = jnp.ones((512, 512))\nparams = {'w': jnp.ones((64, 64))}\nkeep = [weights]",
            "%jaxmem top 2",
            "%jaxmem free params weights",
            "%jaxmem free nothing_here",
            "%jaxmem top many",
            "print(sorted(k for k in ('weights', 'params', 'keep') if k in globals()))",
        ]
    )
    assert "JAX is not imported in this process" in outputs[1].stdout
    top = outputs[3].stdout
    assert "weights, keep[0]" in top and "params['w']" in top and "1.00 MiB" in top
    freed = outputs[4].stdout
    assert "freed params" in freed and "kept weights" in freed and "keep[0]" in freed
    assert "UsageError" in outputs[5].text and "no such name" in outputs[5].text
    assert "UsageError" in outputs[6].text
    assert outputs[7].stdout.strip() == "['keep', 'weights']"
