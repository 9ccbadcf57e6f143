"""What else decides JAX's GPU memory beyond the three allocator variables, read as JAX reads it.

Each fact here is traceable to a line of JAX's or XLA's source (jax tags 0.4.26-0.11.0):

* ``XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB`` (``generate_pjrt_gpu_plugin_options`` in
  ``jaxlib/xla_client.py``, ``int(value) * (1 << 20)``): a second allocator for collective
  memory (``CreateCollectiveBFCAllocator`` in XLA's ``gpu_helpers.cc``) takes that many bytes
  per GPU when the backend starts, outside ``memory_stats()`` (which reports the default
  memory space only). Not with ``platform`` (XLA warns and takes none) nor ``vmm`` (its branch
  returns before the collective allocator is added).
* ``XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE`` (from jaxlib 0.7.0) and
  ``XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT`` (from jaxlib 0.7.1, the ``jax-v0.7.1`` tag's
  ``xla_client.py``): read as ``bool(int(value))``, so a value that is not an integer raises
  ValueError and the GPU backend does not start.
* ``TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`` (``SetStreamAndPreallocateMemory`` in
  ``gpu_cudamallocasync_allocator.cc``): with ``cuda_async``, ``-1`` takes the whole pool size
  up front and a positive N takes N bytes, with preallocation on or off.
* ``XLA_FLAGS``' ``--xla_gpu_command_buffer_update_mode``: any value but ``ALWAYS_UPDATE`` (its
  default) makes the plugin of jaxlib 0.10.2 and later override the allocator to ``vmm``
  (``GetStreamExecutorGpuDeviceAllocator`` in ``se_gpu_pjrt_client.cc``).
* ``jax_pjrt_client_create_options`` (jax 0.4.29 and later; ``JAX_PJRT_CLIENT_CREATE_OPTIONS``
  or ``jax.config.update``): merged *after* the options the environment gave
  (``make_pjrt_c_api_client`` in ``jax/_src/xla_bridge.py``), and read again at each client
  creation, whereas the environment's options are fixed when the plugin registers. Its string
  form ``"k1:v1;k2:v2"`` keeps every value a string, which the CUDA plugin's type check
  (``ValidateCreateOptions`` in ``pjrt_c_api_gpu_internal.cc``) refuses for ``preallocate``
  (a bool), ``memory_fraction`` (a float) and ``collective_memory_size`` (an int): the GPU
  backend then fails to start; only ``allocator`` can be set that way. The dict form (jax
  0.6.2 and later) sets all of them, typed.
* ``jax_cuda_visible_devices`` (a JAX flag, default ``all``; never an environment variable):
  the CUDA devices that get a client, and so a pool.

Never imports jax: JAX's live settings are read from ``sys.modules`` when the user has imported it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "ABORT_COLLECTIVES",
    "ASYNC_PREALLOC",
    "CLIENT_OPTIONS_DICT_SINCE",
    "CLIENT_OPTIONS_ENV",
    "CLIENT_OPTIONS_SINCE",
    "COLLECTIVE_MEM",
    "EXTRA_VARIABLES",
    "FROM_ENVIRON",
    "USE_TFRT",
    "VMM_OVERRIDE_SINCE",
    "ClientOptions",
    "Extras",
    "client_options",
    "cuda_visible_devices",
    "jax_pool_devices",
    "live_client_options",
    "read_extras",
]

COLLECTIVE_MEM = "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB"
ABORT_COLLECTIVES = "XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE"
USE_TFRT = "XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT"
ASYNC_PREALLOC = "TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC"
CLIENT_OPTIONS_ENV = "JAX_PJRT_CLIENT_CREATE_OPTIONS"
_XLA_FLAGS = "XLA_FLAGS"
# Every variable %jaxalloc reports besides the four it manages, with the jaxlib that reads it.
EXTRA_VARIABLES = (
    (COLLECTIVE_MEM, (0, 4, 26)),
    (ABORT_COLLECTIVES, (0, 7, 0)),
    (USE_TFRT, (0, 7, 1)),
    (ASYNC_PREALLOC, (0, 4, 26)),
    (CLIENT_OPTIONS_ENV, (0, 4, 29)),
)
CLIENT_OPTIONS_SINCE = (0, 4, 29)
CLIENT_OPTIONS_DICT_SINCE = (0, 6, 2)
VMM_OVERRIDE_SINCE = (0, 10, 2)
_UPDATE_MODE = re.compile(r"--xla_gpu_command_buffer_update_mode=(\S+)")
# The CUDA plugin's types for the options a user sets (pjrt_c_api_gpu_internal.cc).
_OPTION_TYPES: dict[str, type] = {
    "allocator": str,
    "preallocate": bool,
    "memory_fraction": float,
    "collective_memory_size": int,
}

# Say "read the options from the environment given" (another process's, or before jax loads).
FROM_ENVIRON: Any = object()


@dataclass(frozen=True)
class ClientOptions:
    """What ``jax_pjrt_client_create_options`` overrides, or why it stops the GPU backend.

    ``overrides`` maps an option (``allocator``, ``preallocate``, ``memory_fraction``,
    ``collective_memory_size``) to its typed value; ``error`` is set when the plugin (or
    JAX) would refuse the value, so that no GPU backend starts. ``form`` is ``str``, ``dict``
    or ``None`` (not set).
    """

    form: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class Extras:
    """The settings beyond the allocator trio that change what JAX holds or whether it starts.

    ``collective_bytes``: what the collective allocator takes per GPU at start (None: none
    asked). ``async_prealloc``: ``TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`` as a number (-1:
    the pool size). ``update_mode``: ``XLA_FLAGS``' command-buffer update mode, when set.
    ``errors``: values jaxlib refuses (the backend does not start).
    """

    collective_bytes: int | None = None
    abort_collectives: bool | None = None
    use_tfrt: bool | None = None
    async_prealloc: int | None = None
    update_mode: str | None = None
    vmm_forced: bool = False
    errors: tuple[str, ...] = ()


def _int_of(name: str, text: str, errors: list[str]) -> int | None:
    try:
        return int(text)
    except ValueError:
        errors.append(f"{name}={text!r} is not an integer (jaxlib's int() raises ValueError)")
        return None


def read_extras(environ: Mapping[str, str], release: tuple[int, ...] | None) -> Extras:
    """Read the extra variables from *environ* as jaxlib *release* reads them (None: newest)."""
    errors: list[str] = []

    def reads(since: tuple[int, ...]) -> bool:
        return release is None or release >= since

    collective = None
    text = environ.get(COLLECTIVE_MEM, "")
    if text:
        megabytes = _int_of(COLLECTIVE_MEM, text, errors)
        collective = megabytes * (1 << 20) if megabytes else None
    flags = {}
    for name, since in ((ABORT_COLLECTIVES, (0, 7, 0)), (USE_TFRT, (0, 7, 1))):
        value = environ.get(name)
        if value is not None and reads(since):
            number = _int_of(name, value, errors)
            flags[name] = bool(number) if number is not None else None
    prealloc = None
    text = environ.get(ASYNC_PREALLOC, "")
    if text:  # XLA's ReadInt64FromEnvVar fails its TF_CHECK_OK on a non-number
        prealloc = _int_of(ASYNC_PREALLOC, text, errors)
    modes = _UPDATE_MODE.findall(environ.get(_XLA_FLAGS, ""))
    update_mode = modes[-1] if modes else None  # the last flag wins, as in XLA's flag parser
    vmm_forced = bool(update_mode) and update_mode != "ALWAYS_UPDATE"
    return Extras(
        collective_bytes=collective,
        abort_collectives=flags.get(ABORT_COLLECTIVES),
        use_tfrt=flags.get(USE_TFRT),
        async_prealloc=prealloc,
        update_mode=update_mode,
        vmm_forced=vmm_forced and reads(VMM_OVERRIDE_SINCE),
        errors=tuple(errors),
    )


def live_client_options(environ: Mapping[str, str]) -> Any:
    """``jax_pjrt_client_create_options`` as the user's JAX holds it, else as *environ* says.

    Read from JAX's config only if ``jax`` is already imported (its value may be a dict set by
    ``jax.config.update``); before that, ``$JAX_PJRT_CLIENT_CREATE_OPTIONS``, as JAX's config
    reads it at import.
    """
    config = sys.modules.get("jax._src.config") if "jax" in sys.modules else None
    state = getattr(config, "jax_pjrt_client_create_options", None)
    try:
        if state is not None:
            return state.value
    except Exception:  # JAX's internals moved: the environment says what it would start with
        pass
    return environ.get(CLIENT_OPTIONS_ENV) or None


def client_options(value: Any, release: tuple[int, ...] | None) -> ClientOptions:
    """What *value* of ``jax_pjrt_client_create_options`` does to the CUDA client.

    *release*: the installed jax's (None: newest). Before jax 0.4.29 the option does not exist.
    """
    if value is None or value == "" or (release is not None and release < CLIENT_OPTIONS_SINCE):
        return ClientOptions(None)
    if isinstance(value, str):
        return _string_options(value)
    if isinstance(value, dict):
        if release is not None and release < CLIENT_OPTIONS_DICT_SINCE:
            return ClientOptions("dict", error="a dict is read from jax 0.6.2 on; this jax "
                                 "calls .split() on it and the backend does not start")  # fmt: skip
        return _dict_options(value)
    return ClientOptions(type(value).__name__, error="neither a string nor a dict")


def _string_options(text: str) -> ClientOptions:
    overrides: dict[str, Any] = {}
    for part in text.split(";"):
        pieces = part.split(":")
        if len(pieces) != 2:  # xla_bridge raises RuntimeError ("Multiple ':' separators")
            return ClientOptions("str", error=f"{part!r} is not 'key:value'", text=text)
        key, value = pieces
        expected = _OPTION_TYPES.get(key)
        if expected is not None and expected is not str:
            return ClientOptions(
                "str",
                error=f"'{key}:{value}' stays a string, and the CUDA plugin wants a "
                f"{expected.__name__} for {key}: the GPU backend does not start (the dict form, "
                "jax 0.6.2 and later, passes it typed)",
                text=text,
            )
        if expected is str:
            overrides[key] = value
    return ClientOptions("str", overrides, text=text)


def _dict_options(options: dict) -> ClientOptions:
    overrides: dict[str, Any] = {}
    for key, value in options.items():
        expected = _OPTION_TYPES.get(key)
        if expected is None:
            continue
        # JAX passes a Python bool as a bool and an int as an int64: a float option given an
        # int (or a bool, a subclass of int) is of the wrong type for the plugin.
        if type(value) is not expected:
            return ClientOptions(
                "dict",
                error=f"{key}={value!r} is a {type(value).__name__}, and the CUDA plugin wants "
                f"a {expected.__name__}: the GPU backend does not start",
            )
        overrides[key] = value
    return ClientOptions("dict", overrides)


def cuda_visible_devices() -> tuple[int, ...] | None:
    """``jax_cuda_visible_devices`` as the user's JAX holds it: the CUDA device ids, or None.

    None for ``all`` (the default), when jax is not imported, or when it cannot be read.
    """
    if "jax" not in sys.modules:
        return None
    bridge = sys.modules.get("jax._src.xla_bridge")
    try:
        value = bridge.CUDA_VISIBLE_DEVICES.value  # type: ignore[union-attr]
        if not isinstance(value, str) or value == "all":
            return None
        return tuple(int(x) for x in value.split(","))
    except Exception:
        return None


def jax_pool_devices(visible: Sequence[T]) -> list[T]:
    """Those of ``visible`` that this process's JAX makes a client and a pool on.

    ``visible``: the GPUs CUDA lets it see, in CUDA's order. ``jax_cuda_visible_devices``
    (CUDA device ids, counted among them) narrows them where the user set it.
    """
    chosen = cuda_visible_devices()
    if chosen is None:
        return list(visible)
    return [visible[ordinal] for ordinal in chosen if 0 <= ordinal < len(visible)]
