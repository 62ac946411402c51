"""The NIC suite's load probe (ptf_tests.pna_nic.load_probe) against fake pna_nic binaries:
only a stock pna_nic's refusal of a register primitive is a reason to skip."""

from __future__ import annotations

import sys
from pathlib import Path

from ptf_tests.pna_nic import load_probe

CONFIG = Path("forgive_nic.json")


def fake(tmp_path: Path, body: str) -> str:
    """An executable standing in for pna_nic; it appends one line to `starts` per start."""
    script = tmp_path / "pna_nic"
    script.write_text(
        f"#!{sys.executable}\n"
        "import socket, sys, time\n"
        f"open({str(tmp_path / 'starts')!r}, 'a').write('start\\n')\n"
        "port = int(sys.argv[sys.argv.index('--thrift-port') + 1])\n" + body
    )
    script.chmod(0o755)
    return str(script)


def starts(tmp_path: Path) -> int:
    return len((tmp_path / "starts").read_text().splitlines())


def refuses(primitive: str, status: int = 1) -> str:
    """What BMv2 9674187 prints and does when the JSON names a primitive it lacks."""
    return f"print('Unknown primitive action: {primitive}', flush=True)\nsys.exit({status})\n"


LOADS = (
    "server = socket.socket()\nserver.bind(('127.0.0.1', port))\nserver.listen()\ntime.sleep(60)\n"
)


def test_a_stock_pna_nic_is_a_one_line_skip_naming_binary_primitive_and_docs(
    tmp_path: Path,
) -> None:
    binary = fake(tmp_path, refuses("register_read"))
    reason = load_probe(binary, CONFIG)
    assert reason is not None and "\n" not in reason
    assert binary in reason and "register_read" in reason and "docs/nic.md" in reason


def test_register_write_refused_is_the_same_skip(tmp_path: Path) -> None:
    reason = load_probe(fake(tmp_path, refuses("register_write")), CONFIG)
    assert reason is not None and "register_write" in reason


def test_a_pna_nic_that_loads_is_no_reason_and_is_started_once(tmp_path: Path) -> None:
    binary = fake(tmp_path, LOADS)
    assert load_probe(binary, CONFIG) is None
    assert load_probe(binary, CONFIG) is None
    assert starts(tmp_path) == 1


def test_the_probe_stops_what_it_started(tmp_path: Path) -> None:
    record_pid = f"open({str(tmp_path / 'pid')!r}, 'w').write(str(__import__('os').getpid()))\n"
    assert load_probe(fake(tmp_path, record_pid + LOADS), CONFIG) is None
    assert not Path(f"/proc/{(tmp_path / 'pid').read_text()}").exists()


def test_failures_other_than_the_register_primitives_are_left_to_the_suite(
    tmp_path: Path,
) -> None:
    """A primitive the program should not need, a JSON the binary cannot parse, the stock
    message with success, a binary that neither loads nor exits: the suite runs and fails."""
    bodies = (
        refuses("modify_field_rng_uniform"),
        "print('JSON parse error: unexpected token')\nsys.exit(1)\n",
        "print('Segmentation fault')\nsys.exit(-11)\n",
        refuses("register_read", status=0),
        "print('Unknown primitive action: register_read', flush=True)\ntime.sleep(60)\n",
    )
    for n, body in enumerate(bodies):
        where = tmp_path / str(n)
        where.mkdir()
        assert load_probe(fake(where, body), CONFIG, timeout=1.0) is None, body
