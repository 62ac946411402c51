"""The agent's pure pieces: the bound check and neighbour resolution."""

import pytest

from common.frames import ARP_REPLY, ARP_REQUEST, arp_frame, ip_bytes, mac_bytes, parse_arp
from host_agent.core import StepState
from host_agent.neighbors import ARP_RETRY, UNRESOLVED_QUEUE, Neighbors
from host_agent.stats import bound_violation

ME_MAC, ME_IP = mac_bytes("02:00:00:00:00:01"), ip_bytes("10.1.0.1")
PEER_MAC, PEER_IP = mac_bytes("02:00:00:00:00:02"), ip_bytes("10.1.0.2")


def state(p, budget, received, forgiven):
    return StepState(p, budget, 0, received, forgiven, 0, True, 0)


@pytest.mark.parametrize(
    ("st", "vesting", "bad"),
    [
        (state(0.1, 1000, 9000, 1000), True, False),  # exactly p/(1-p) * received
        (state(0.1, 1000, 8999, 1000), True, True),  # one byte short of vesting
        (state(0.1, 1000, 0, 1000), False, False),  # full budget: no vesting bound
        (state(0.1, 999, 9000, 1000), False, True),  # over budget either way
        (state(0.0, 0, 5000, 1), True, True),  # p = 0 forgives nothing
        (state(0.0, 0, 5000, 0), True, False),
        (state(0.005, 40, 7960, 40), True, False),
    ],
)
def test_bound_violation(st, vesting, bad):
    assert (bound_violation(st, vesting) is not None) is bad


def make():
    sent, released = [], []
    n = Neighbors(ME_MAC, ME_IP, sent.append, lambda *a: released.append(a), {}, None)
    return n, sent, released


def test_arp_resolution_holds_packets_then_releases_them():
    n, sent, released = make()
    assert n.resolve(PEER_IP, 0.0) is None
    assert parse_arp(sent[0]).op == ARP_REQUEST and parse_arp(sent[0]).target_ip == PEER_IP
    assert n.resolve(PEER_IP, ARP_RETRY / 2) is None and len(sent) == 1
    assert n.resolve(PEER_IP, ARP_RETRY) is None and len(sent) == 2
    for i in range(UNRESOLVED_QUEUE + 3):
        n.hold(PEER_IP, (10, i, b"x"))
    assert n.dropped == 3
    reply = arp_frame(ARP_REPLY, PEER_MAC, PEER_IP, ME_MAC, ME_MAC, ME_IP)
    assert n.on_arp(reply)
    (ip, mac, packets) = released[0]
    assert (ip, mac, len(packets)) == (PEER_IP, PEER_MAC, UNRESOLVED_QUEUE)
    assert n.resolve(PEER_IP, 1.0) == PEER_MAC


def test_answers_arp_for_its_address_only():
    n, sent, _ = make()
    ask = arp_frame(ARP_REQUEST, PEER_MAC, PEER_IP, b"\xff" * 6, bytes(6), ME_IP)
    assert n.on_arp(ask)
    answer = parse_arp(sent[-1])
    assert answer.op == ARP_REPLY and answer.sender_mac == ME_MAC and answer.sender_ip == ME_IP
    other = arp_frame(ARP_REQUEST, PEER_MAC, PEER_IP, b"\xff" * 6, bytes(6), ip_bytes("10.1.0.9"))
    assert n.on_arp(other) and len(sent) == 1
    assert not n.on_arp(b"\x00" * 60)


def test_static_entries_and_gateway_need_no_arp():
    sent = []
    static = Neighbors(ME_MAC, ME_IP, sent.append, print, {PEER_IP: PEER_MAC}, None)
    assert static.resolve(PEER_IP, 0.0) == PEER_MAC
    gw = Neighbors(ME_MAC, ME_IP, sent.append, print, {}, mac_bytes("02:00:00:00:00:fe"))
    assert gw.resolve(ip_bytes("10.9.9.9"), 0.0) == mac_bytes("02:00:00:00:00:fe")
    assert sent == []
