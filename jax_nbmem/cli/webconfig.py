"""The exporter's TLS and basic auth, from a web-config file as Prometheus exporters read it.

The file is the one of the Prometheus exporter toolkit (``--web.config.file``, as
node_exporter takes it)::

    tls_server_config:
      cert_file: /etc/jax_nbmem/exporter.crt
      key_file: /etc/jax_nbmem/exporter.key
    basic_auth_users:
      prometheus: $2y$10$...   # a bcrypt hash: htpasswd -nbBC 10 prometheus PASSWORD

Both parts are needed for a listener that is not loopback (or ``--insecure``, said loudly).
A bad file is refused with its reason at start, never half applied. Passwords are checked
with bcrypt (``pip install bcrypt``); a pair once accepted is remembered by its SHA-256, so a
scrape does not pay bcrypt's cost every time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["WebConfig", "load_web_config"]

_KNOWN = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TLS_KNOWN = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}


@dataclass
class WebConfig:
    """TLS (an ``ssl.SSLContext``) and basic-auth users (name → bcrypt hash); either may be None."""

    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] | None = None
    _accepted: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header names a user with the right password."""
        if self.users is None:
            return True
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).partition(
                b":"
            )
        except (binascii.Error, ValueError):
            return False
        wanted = self.users.get(user.decode("utf-8", "replace"))
        if not sep or wanted is None:
            return False
        key = hashlib.sha256(user + b"\0" + password + b"\0" + wanted).digest()
        with self._lock:
            if any(hmac.compare_digest(key, seen) for seen in self._accepted):
                return True
        import bcrypt

        try:
            good = bcrypt.checkpw(password, wanted)
        except ValueError:
            return False
        if good:
            with self._lock:
                self._accepted.add(key)
        return good


def load_web_config(path: str) -> WebConfig:
    """Read and check a web-config file; ValueError with the reason when it cannot be used."""
    import yaml

    try:
        content = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as error:
        raise ValueError(f"cannot read --web.config.file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"--web.config.file {path} is not YAML: {error}") from None
    if not isinstance(content, dict) or set(content) - _KNOWN:
        unknown = ", ".join(sorted(set(content) - _KNOWN)) if isinstance(content, dict) else "?"
        raise ValueError(f"--web.config.file {path}: unknown keys {unknown}")
    config = WebConfig()
    tls = content.get("tls_server_config")
    if tls is not None:
        config.tls = _tls_context(tls, path)
    users = content.get("basic_auth_users")
    if users is not None:
        config.users = _users(users, path)
    return config


def _tls_context(tls: object, path: str) -> ssl.SSLContext:
    if not isinstance(tls, dict) or set(tls) - _TLS_KNOWN:
        raise ValueError(f"--web.config.file {path}: tls_server_config wants cert_file, key_file")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise ValueError(
            f"--web.config.file {path}: tls_server_config needs cert_file and key_file"
        )
    base = Path(path).parent
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(base / tls["cert_file"], base / tls["key_file"])
        if tls.get("client_ca_file"):
            context.load_verify_locations(base / tls["client_ca_file"])
            if tls.get("client_auth_type", "RequireAndVerifyClientCert") != "NoClientCert":
                context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"--web.config.file {path}: cannot load the certificate: {error}"
        ) from None
    return context


def _users(users: object, path: str) -> dict[str, bytes]:
    if not isinstance(users, dict) or not users:
        raise ValueError(f"--web.config.file {path}: basic_auth_users wants name: bcrypt-hash")
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        raise ValueError(
            f"--web.config.file {path}: basic_auth_users needs bcrypt: pip install bcrypt"
        ) from None
    found = {}
    for name, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ValueError(f"--web.config.file {path}: the password of {name} is no bcrypt hash")
        # bcrypt for Python reads $2b$; htpasswd writes $2y$, the same algorithm.
        found[str(name)] = ("$2b$" + hashed[4:]).encode()
    return found
