"""``python -m jax_nbmem.simgpu``: build the stand-in library, write states, set up a shell."""

import sys

from jax_nbmem.simgpu.shared import main

sys.exit(main())
