"""The files of P4Runtime over TLS, read alike by the switch model's server and the controller.

P4Runtime's specification asks for the channel between a switch and its controllers to be
protected ("Security concerns": TLS to authenticate and encrypt the gRPC channel, mutual TLS
so that the switch authenticates its clients too), and says that anyone who can open a
channel could otherwise take mastership and reprogram the switch. gRPC takes certificates
and keys as PEM bytes; this module reads them, so that a missing, unreadable or non-PEM file
is one line naming it before any port is opened or any switch dialled, rather than a
handshake that fails later without saying why.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

PEM_BEGIN = b"-----BEGIN "


class TlsError(ValueError):
    """A certificate or key that cannot be used; the message names the file and the option."""


def read_pem(path: Path, what: str) -> bytes:
    """The PEM bytes of `path`; TlsError naming `what` (the option that gave it) otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise TlsError(f"{what} {path}: {err.strerror or err}") from None
    if PEM_BEGIN not in data:
        raise TlsError(f"{what} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def _check_pair(cert: Path, key: Path) -> None:
    """That the key is the certificate's (gRPC would only fail the handshake later)."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as err:
        raise TlsError(
            f"--tls-cert {cert} and --tls-key {key}: not a certificate and its key ({err.reason})"
        ) from None


def _check_ca(path: Path, what: str) -> None:
    try:
        ssl.create_default_context().load_verify_locations(cafile=path)
    except ssl.SSLError as err:
        raise TlsError(f"{what} {path}: not a CA certificate ({err.reason})") from None


@dataclass(frozen=True)
class ServerTls:
    """A switch's side of P4Runtime over TLS: its certificate (chain) and private key, and
    the CA whose certificates its clients must present (mutual TLS), or None to accept any
    client that completes the handshake."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def pems(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate chain, key, client CA or None), each checked to be PEM."""
        cert, key = read_pem(self.cert, "--tls-cert"), read_pem(self.key, "--tls-key")
        _check_pair(self.cert, self.key)
        ca = None
        if self.client_ca is not None:
            ca = read_pem(self.client_ca, "--tls-client-ca")
            _check_ca(self.client_ca, "--tls-client-ca")
        return cert, key, ca


@dataclass(frozen=True)
class ClientTls:
    """A controller's side: the CA that signed the switches' certificates, the controller's
    own certificate and key where the switches ask for one (mutual TLS), and the name to
    check a switch's certificate against when it is not the host part of the switch's
    address (a certificate for a DNS name, dialled by IP)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsError("--tls-cert and --tls-key go together (the controller's own pair)")

    def pems(self) -> tuple[bytes, bytes | None, bytes | None]:
        """(CA, certificate chain or None, key or None), each checked to be PEM."""
        ca = read_pem(self.ca, "--tls-ca")
        _check_ca(self.ca, "--tls-ca")
        if self.cert is None or self.key is None:
            return ca, None, None
        cert, key = read_pem(self.cert, "--tls-cert"), read_pem(self.key, "--tls-key")
        _check_pair(self.cert, self.key)
        return ca, cert, key
