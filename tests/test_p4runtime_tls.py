"""P4Runtime over TLS: the switch model's server, BMv2's --grpc-server-ssl, forgive-switch,
forgive-ctl and a run's controller, with certificates made in the test (tests/tls_certs.py).

With a client CA (mutual TLS) a client is refused in the handshake unless it presents a
certificate that CA signed: none, another CA's, or no TLS at all. A client that does not
trust the CA that signed the switch's certificate refuses the switch. The right pair works,
to a pipeline pushed and an entry written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from switch_harness import (
    NETNS,
    Bmv2Process,
    ModelProcess,
    VethSet,
    device_config,
    free_tcp_port,
    p4info,
    p4info_path,
)
from tls_certs import make_pki

from commands import ctl
from common import native, p4names
from common.tls import ClientTls, ServerTls, TlsError
from controller.client import SwitchClient, SwitchUnreachable
from controller.p4info import P4InfoIndex
from runplan.run import RunConfig, RunError, client_tls, server_tls
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import SwitchService, serve
from topologies.switches import bmv2_tls_options

REFUSED_WITHIN_S = 2.0
"""How long a refused client waits for a channel that never becomes ready."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def route(ip: int):
    return P4InfoIndex(p4info()).table_entry(
        p4names.LPM_TABLE,
        {"hdr.ipv4.dstAddr": (ip, 32)},
        p4names.SET_NHOP,
        {"dmac": 0x020000000001, "port": 1},
    )


def configures(address: str, tls: ClientTls | None, device_id: int = 1) -> None:
    """Become primary, push forgive.p4 and write one route: what a controller does first."""
    client = SwitchClient("s1", address, device_id, tls=tls, timeout=REFUSED_WITHIN_S)
    try:
        client.connect()
        client.set_pipeline(p4info(), device_config(), 7)
        client.insert([route(0x0A000001)])
    finally:
        client.close()


def refused(address: str, tls: ClientTls | None, device_id: int = 1) -> str:
    """The one line a client that the switch (or that refuses the switch) is given."""
    with pytest.raises(SwitchUnreachable) as err:
        configures(address, tls, device_id)
    return str(err.value)


@pytest.fixture
def model(pki):
    """The model's P4Runtime server in this process, over mutual TLS."""
    address = f"127.0.0.1:{free_tcp_port()}"
    tls = ServerTls(pki.switch_cert, pki.switch_key, pki.ca)
    server = serve(SwitchService(1, Dataplane({1: "unused"})), address, tls)
    yield address
    server.stop(0).wait()


def test_mutual_tls_admits_the_controller_its_ca_signed(model, pki):
    configures(model, ClientTls(pki.ca, pki.controller_cert, pki.controller_key))


def test_a_client_without_a_valid_certificate_is_refused(model, pki):
    for tls in (
        None,  # no TLS at all
        ClientTls(pki.ca),  # TLS, but no client certificate
        ClientTls(pki.ca, pki.rogue_controller_cert, pki.rogue_controller_key),  # another CA's
    ):
        line = refused(model, tls)
        assert (
            line.startswith(f"switch s1 at {model} did not answer within 2 s") and "\n" not in line
        )


def test_tls_without_a_client_ca_takes_any_client_over_tls_and_is_checked_by_it(pki):
    """Server-side TLS only: a client without a certificate is admitted, one without TLS is
    not, and a client whose CA did not sign the switch's certificate refuses the switch
    (the switch asks nothing of it here, so the refusal is the client's)."""
    address = f"127.0.0.1:{free_tcp_port()}"
    server = serve(
        SwitchService(1, Dataplane({1: "unused"})),
        address,
        ServerTls(pki.switch_cert, pki.switch_key),
    )
    try:
        configures(address, ClientTls(pki.ca))
        refused(address, None)
        assert "handshake failed" in refused(address, ClientTls(pki.rogue_ca))
        wrong_name = ClientTls(pki.ca, server_name="switch.example")  # not the certificate's
        assert "handshake failed" in refused(address, wrong_name)
        configures(address, ClientTls(pki.ca, server_name="localhost"))
    finally:
        server.stop(0).wait()


def test_bad_certificate_files_are_one_line_before_any_port(pki, tmp_path):
    text = tmp_path / "text.pem"
    text.write_text("not a certificate\n")
    cases = [
        (
            ServerTls(tmp_path / "missing.pem", pki.switch_key),
            "--tls-cert .*missing.pem: No such file",
        ),
        (ServerTls(text, pki.switch_key), "--tls-cert .*text.pem: not a PEM file"),
        (ServerTls(pki.controller_cert, pki.switch_key), "not a certificate and its key"),
        (
            ServerTls(pki.switch_cert, pki.switch_key, pki.switch_key),
            "--tls-client-ca .*: not a CA",
        ),
    ]
    for tls, message in cases:
        with pytest.raises(TlsError, match=message) as err:
            serve(SwitchService(1, Dataplane({1: "unused"})), f"127.0.0.1:{free_tcp_port()}", tls)
        assert "\n" not in str(err.value)
    with pytest.raises(TlsError, match="--tls-cert and --tls-key go together"):
        ClientTls(pki.ca, pki.controller_cert)


def test_forgive_switch_refuses_bad_tls_options_in_one_line(pki, tmp_path):
    base = [sys.executable, "-m", "commands.switch", "-i", "1=lo", "--grpc", "127.0.0.1:1"]
    for extra, message in [
        (["--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(pki.switch_key)],
         "--tls-cert " + str(tmp_path / "none.pem") + ": No such file or directory"),
        (["--tls-cert", str(pki.switch_cert)], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", str(pki.ca)], "--tls-client-ca needs --tls-cert and --tls-key"),
    ]:  # fmt: skip
        done = subprocess.run(
            [*base, *extra], capture_output=True, text=True, cwd=native.ROOT, timeout=60
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].endswith(message)


def test_forgive_ctl_refuses_bad_tls_options_in_one_line(pki, tmp_path, capsys):
    (tmp_path / "fabric.json").write_text(
        '{"switches": {"s1": {"target": "bmv2", "grpc": "127.0.0.1:1", "device_id": 1}},'
        ' "hosts": {}, "links": []}'
    )
    fabric = str(tmp_path / "fabric.json")
    for extra, message in [
        (["--tls-cert", str(pki.controller_cert)], "need --tls-ca"),
        (["--tls-ca", str(pki.ca), "--tls-key", str(pki.controller_key)], "go together"),
        (["--tls-ca", str(pki.controller_key)], "--tls-ca " + str(pki.controller_key) + ": not a CA"),
    ]:  # fmt: skip
        assert ctl.main(["counters", fabric, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def netns(test):
    """Veths and raw sockets: run under the namespace lock, skipped where they cannot run."""
    for mark in NETNS:
        test = mark(test)
    return test


def one_switch(switch: ModelProcess) -> str:
    return json.dumps(
        {
            "switches": {
                "s1": {"target": "model", "grpc": switch.grpc, "device_id": 1,
                       "control": switch.control},
            },
            "hosts": {"h1": {"ip": "10.0.1.1", "mac": "02:00:00:00:01:01"}},
            "links": [{"a": "h1", "b": "s1:1"}],
        }
    )  # fmt: skip


@netns
def test_forgive_switch_and_forgive_ctl_over_mutual_tls(pki, tmp_path, capsys):
    """A forgive-switch process serving P4Runtime over mutual TLS: forgive-ctl configures it
    with the controller's pair, and without it is refused in one line."""
    (tmp_path / "dev.json").write_bytes(device_config())
    server = ["--tls-cert", str(pki.switch_cert), "--tls-key", str(pki.switch_key)]
    server += ["--tls-client-ca", str(pki.ca)]
    with (
        VethSet(1) as veths,
        ModelProcess(veths.interfaces(), workdir=tmp_path, extra=server) as s1,
    ):
        (tmp_path / "fabric.json").write_text(one_switch(s1))
        apply = ["apply", str(tmp_path / "fabric.json"), "--p4info", str(p4info_path())]
        apply += ["--device-config", str(tmp_path / "dev.json")]
        assert ctl.main(apply) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"forgive-ctl: switch s1 at {s1.grpc} did not answer within")
        assert err.endswith("(or it speaks only TLS)") and "\n" not in err
        tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.controller_cert)]
        tls += ["--tls-key", str(pki.controller_key)]
        assert ctl.main([*apply, *tls]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith("s1: pipeline pushed, ")
        assert f"P4Runtime {s1.grpc} over mutual TLS" in s1.log.read_text()


def test_bmv2_serves_p4runtime_over_mutual_tls(pki):
    """BMv2's own TLS (simple_switch_grpc --grpc-server-ssl ... --grpc-server-with-client-auth),
    with the options a run gives it: the controller's pair works, no certificate does not."""
    missing = Bmv2Process.missing()
    if missing:
        pytest.skip(missing)
    options = bmv2_tls_options(ServerTls(pki.switch_cert, pki.switch_key, pki.ca))
    with Bmv2Process({}, extra=options) as bmv2:
        configures(bmv2.grpc, ClientTls(pki.ca, pki.controller_cert, pki.controller_key))
        refused(bmv2.grpc, ClientTls(pki.ca))
        refused(bmv2.grpc, None)


def test_a_runs_tls_folder_is_checked_before_anything_starts(pki, tmp_path):
    """`forgive run --p4runtime-tls DIR`: every file of the folder, for the emulation only."""
    from runplan.fabric import preset

    good = RunConfig(preset("2to1"), p4runtime_tls=str(pki.folder))
    good.validate()
    assert server_tls(pki.folder) == ServerTls(pki.switch_cert, pki.switch_key, pki.ca)
    assert client_tls(pki.folder) == ClientTls(pki.ca, pki.controller_cert, pki.controller_key)
    with pytest.raises(RunError, match="--p4runtime-tls needs --engine mininet"):
        RunConfig(preset("2to1"), engine="sim", p4runtime_tls=str(pki.folder)).validate()
    with pytest.raises(
        RunError, match=f"--p4runtime-tls {tmp_path}: --tls-cert {tmp_path}/switch.pem"
    ):
        RunConfig(preset("2to1"), p4runtime_tls=str(tmp_path)).validate()


def test_the_shell_reads_a_switch_over_mutual_tls(model, pki):
    """`forgive-ctl shell` with the controller's pair: its check of the pipeline (the
    project's client) and p4runtime-shell itself both speak TLS; without the pair, one line."""
    pytest.importorskip("p4runtime_sh.shell", reason="p4runtime-shell (test extras) missing")
    configures(model, ClientTls(pki.ca, pki.controller_cert, pki.controller_key))
    shell = [sys.executable, "-m", "commands.ctl", "shell", model, "-c"]
    code = f"print('routes:', len(list(TableEntry({p4names.LPM_TABLE!r}).read())))"
    pair = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.controller_cert)]
    pair += ["--tls-key", str(pki.controller_key)]
    read = subprocess.run([*shell, code, *pair], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    assert "routes: 1" in read.stdout
    bare = subprocess.run([*shell, code], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 1 and bare.stderr.count("\n") == 1, bare.stderr
    assert "(or it speaks only TLS)" in bare.stderr
