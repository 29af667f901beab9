"""Test certificates: a CA, a server and a client certificate it signs, and a rogue client signed by
another CA (the `certs` fixture, one set per test module)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by another CA
    rogue_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey, *,
    ca: bool = False, usage: x509.ObjectIdentifier | None = None, san: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("ca", "server", "client", "rogue_ca", "rogue")}
    ca = _issue("hetero-ps test CA", keys["ca"], _name("hetero-ps test CA"), keys["ca"], ca=True)
    rogue_ca = _issue("another CA", keys["rogue_ca"], _name("another CA"), keys["rogue_ca"], ca=True)
    server = _issue("localhost", keys["server"], ca.subject, keys["ca"], usage=ExtendedKeyUsageOID.SERVER_AUTH,
                    san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client = _issue("worker", keys["client"], ca.subject, keys["ca"], usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue = _issue("rogue", keys["rogue"], rogue_ca.subject, keys["rogue_ca"], usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    ca_path, _ = _write(directory, "ca", ca, keys["ca"])
    server_paths = _write(directory, "server", server, keys["server"])
    client_paths = _write(directory, "client", client, keys["client"])
    rogue_paths = _write(directory, "rogue", rogue, keys["rogue"])
    return Certs(ca_path, *server_paths, *client_paths, *rogue_paths)
