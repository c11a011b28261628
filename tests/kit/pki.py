"""A throwaway PKI for the tests' TLS servers (kube-apiserver, registry, token service)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: str, issuer: x509.Name, key: rsa.RSAPrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)))


def make_ca(cn: str = "nodeagent-test-ca") -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    key = new_key()
    cert = (_builder(cn, _name(cn), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def self_signed(cn: str) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    """A leaf that is its own root (no extensions): e.g. a registry token signer."""
    key = new_key()
    return _builder(cn, _name(cn), key).sign(key, hashes.SHA256()), key


def serving_cert(ca: tuple[x509.Certificate, rsa.RSAPrivateKey],
                 cn: str) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    """A server certificate for localhost and 127.0.0.1, signed by `ca`."""
    key = new_key()
    cert = (_builder(cn, ca[0].subject, key)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca[1], hashes.SHA256()))
    return cert, key


def write_serving_pki(d: Path, cn: str) -> None:
    """ca.crt, server.crt, server.key in `d`."""
    ca = make_ca()
    cert, key = serving_cert(ca, cn)
    (d / "ca.crt").write_bytes(pem_cert(ca[0]))
    (d / "server.crt").write_bytes(pem_cert(cert))
    (d / "server.key").write_bytes(pem_key(key))
