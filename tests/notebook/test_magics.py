"""The extension's cell callbacks: what they read before every cell, cheaply and exactly."""

from types import SimpleNamespace

from traitlets import HasTraits, Integer

from jax_nbmem.notebook.magics import _execution_count_reader


class Shell(HasTraits):
    execution_count = Integer(1)


def test_the_cell_number_comes_from_traitlets_table_once_it_is_there():
    shell = Shell()
    read = _execution_count_reader(shell)
    assert read() == 1  # never set: the trait's default, through the trait
    shell.execution_count = 12
    assert read() == 12
    shell.execution_count += 1
    assert read() == 13 == shell.execution_count


def test_a_shell_without_traitlets_is_asked_for_its_attribute():
    shell = SimpleNamespace(execution_count=7)
    read = _execution_count_reader(shell)
    assert read() == 7
    shell.execution_count = 8
    assert read() == 8
