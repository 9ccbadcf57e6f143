"""``python -m jax_nbmem.cli``: the same as the ``jax-nbmem`` command."""

import sys

from jax_nbmem.cli.command import main

sys.exit(main())
