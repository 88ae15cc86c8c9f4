"""The rollout router's table (serving/ray/routing.py), as the live replicas' polls and the switchboard drive it: a
change is settled only once every replica polled having seen it with no canary request in flight (a switch: once
each follows it), the canary's counts are summed over the replicas, a capture keeps at most its count, a replica
that leaves is not waited for, and the end of a rollout forgets both."""

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")

from serving.ray.routing import RoutingTable  # noqa: E402


def report(epoch: int, canary=None, served=0, failed=0, in_flight=0) -> dict:
    """What a live replica reports (LiveRouting.report): its canary's counts, those asked but not answered yet
    in flight."""
    return {"epoch": epoch, "canary": canary, "asked": served + failed + in_flight, "served": served,
            "failed": failed, "declined": 0, "in_flight": in_flight}


def test_a_canary_is_settled_once_every_replica_follows_it_and_its_counts_are_summed():
    table = RoutingTable()
    assert table.poll("m", "a", report(0))["canary"] is None  # no rollout: nothing routed
    started = table.set_canary("m", "v2", 50)
    routes = table.poll("m", "a", report(0))
    table.poll("m", "b", report(0))
    canary = routes["canary"]
    assert canary["label"] == "v2" and canary["percent"] == 50 and not table.settled("m", started)
    table.poll("m", "a", report(started, canary["id"], served=3))
    table.poll("m", "b", report(started, canary["id"], served=2, in_flight=1))
    assert table.settled("m", started) is False  # b still holds a canary request
    ended = table.set_canary("m", "v2", 0)
    assert table.poll("m", "a", report(started, canary["id"], served=3))["canary"]["id"] == canary["id"]
    table.poll("m", "a", report(ended, canary["id"], served=3))
    table.poll("m", "b", report(ended, canary["id"], served=2, failed=1))
    assert table.settled("m", ended)
    assert table.canary_report("m") == {"label": "v2", "percent": 0, "asked": 6, "served": 5, "failed": 1,
                                        "declined": 0}
    table.set_canary("m", "v2", 10)  # a new canary counts afresh
    assert table.canary_report("m")["served"] == 0


def test_a_capture_keeps_at_most_its_count_and_the_end_forgets_it():
    table = RoutingTable()
    table.set_capture("m", 2)
    capture = table.poll("m", "a", report(0))["capture"]
    for number in range(3):
        table.keep("m", capture["id"], f"r{number}", b"photo%d" % number)
    assert table.captured("m") == [("r0", b"photo0"), ("r1", b"photo1")]
    assert table.poll("m", "a", report(1))["capture"] is None  # full: the replicas stop sending
    table.keep("m", capture["id"] - 1, "stale", b"x")  # an earlier capture's photo
    ended = table.end("m")
    assert table.captured("m") == [] and table.poll("m", "a", report(ended)) == {"epoch": ended, "canary": None,
                                                                                 "capture": None}
    assert table.canary_report("m")["label"] is None and table.end("other") == 0


def test_a_switch_sends_every_request_to_the_new_version_and_is_settled_once_followed():
    table = RoutingTable()
    table.set_capture("m", 5)
    switched = table.set_switch("m", "v2")
    routes = table.poll("m", "a", report(0))
    assert routes["canary"]["label"] == "v2" and routes["canary"]["percent"] == 100 and routes["capture"] is None
    table.poll("m", "a", report(switched, routes["canary"]["id"], served=4, in_flight=2))
    assert table.settled("m", switched, idle=False) and not table.settled("m", switched)  # followed, not idle


def test_a_replica_that_leaves_is_not_waited_for():
    table = RoutingTable()
    started = table.set_canary("m", "v2", 10)
    table.poll("m", "old", report(started))
    ended = table.end("m")
    table.poll("m", "new", report(ended))
    assert not table.settled("m", ended)  # "old" polled lately and has not seen it
    table.leave("m", "old")
    assert table.settled("m", ended)
    table.leave("m", "gone")  # an unknown replica, an unknown name: nothing to forget
    table.leave("other", "x")


def test_the_gate_holds_one_version_per_name_until_it_is_let_go():
    """What a gate replica Serve replaces opens again: the version loaded beside, per name, until released."""
    table = RoutingTable()
    assert table.gate_of("m") is None
    table.set_gate("m", "v2", "/store/m.v2.mar")
    table.set_gate("n", "v5", "/store/n.v5.mar")
    assert table.gate_of("m") == ("v2", "/store/m.v2.mar") and table.gate_of("n") == ("v5", "/store/n.v5.mar")
    table.set_gate("m", None)
    assert table.gate_of("m") is None and table.gate_of("n") == ("v5", "/store/n.v5.mar")
