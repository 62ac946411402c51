"""Certificates made in the test: a CA, a switch's certificate for 127.0.0.1 and a controller's,
both signed by it, and a second CA with a controller of its own that no switch trusts.

Written as a run's --p4runtime-tls folder (runplan.run.TLS_FILES), which forgive-switch,
BMv2 and forgive-ctl read file by file too. EC keys (P-256), valid from an hour ago for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from runplan.run import TLS_FILES


@dataclass(frozen=True)
class Pki:
    folder: Path

    def __getattr__(self, name: str) -> Path:
        if name in TLS_FILES:
            return self.folder / TLS_FILES[name]
        if name.startswith("rogue_"):
            return self.folder / "rogue" / TLS_FILES[name.removeprefix("rogue_")]
        raise AttributeError(name)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, cert: x509.Certificate, key=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool, usage=None, names=()):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _authority(folder: Path, tag: str) -> None:
    """A CA in `folder` (ca.pem) with a switch's and a controller's pair it signed."""
    ca_key = _key()
    ca_name = f"forgive test CA {tag}"
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write(folder / TLS_FILES["ca"], ca)
    switch_key = _key()
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    switch = _certificate(
        "switch", switch_key, ca_name, ca_key, ca=False,
        usage=ExtendedKeyUsageOID.SERVER_AUTH, names=names,
    )  # fmt: skip
    _write(folder / TLS_FILES["switch_cert"], switch, switch_key)
    controller_key = _key()
    controller = _certificate(
        "controller", controller_key, ca_name, ca_key, ca=False,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )  # fmt: skip
    _write(folder / TLS_FILES["controller_cert"], controller, controller_key)


def make_pki(folder: Path) -> Pki:
    """The test's CA and pairs in `folder`, another CA's in `folder/rogue`."""
    _authority(folder, "A")
    _authority(folder / "rogue", "B")
    return Pki(folder)
