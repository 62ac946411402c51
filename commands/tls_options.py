"""The controller's options for P4Runtime over TLS, one set for every command that dials a
switch (`forgive-ctl` and its shell), as forgive-switch and BMv2's --grpc-server-ssl serve it
(docs/switch_model.md, "P4Runtime over TLS")."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.tls import ClientTls, TlsError


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("P4Runtime over TLS (off by default)")
    tls.add_argument(
        "--tls-ca", type=Path, metavar="PEM", help="the CA of the switches' certificates"
    )
    tls.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="the controller's certificate (mutual TLS)"
    )
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name the switches' certificates carry, where it is not their address's host",
    )


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The options as the controller's ClientTls, every file checked (TlsError in one line)."""
    if args.tls_ca is None:
        if args.tls_cert or args.tls_key or args.tls_server_name:
            raise TlsError("--tls-cert, --tls-key and --tls-server-name need --tls-ca")
        return None
    tls = ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    tls.pems()
    return tls
