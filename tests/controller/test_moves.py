"""The move state machine (docs/controller-api.md, "Partition moves"), without I/O: every
interrupted reassignment ends with a leader that can serve, whichever party died."""

from __future__ import annotations

from automq.broker.controller import commands as c
from automq.broker.controller.protocol import Endpoint
from automq.broker.controller.state import MetadataState
from automq.broker.storage.metadata import StreamNotOpenError

EP = [Endpoint("PLAINTEXT", "h", 9092)]


class Cluster:
    def __init__(self) -> None:
        self.state = MetadataState()
        self.run(c.init_cluster, "t")
        self.epochs = {n: self.run(c.register_broker, n, EP, None) for n in (1, 2, 3)}
        p = self.run(c.create_topic, "t", 1, {}).partitions[0]
        self.sid = p.stream_id
        self.old = p.leader
        self.target = 1 + p.leader % 3
        self.bystander = 6 - self.old - self.target
        self.run(c.open_stream, p.stream_id, p.leader_epoch, p.leader, self.epochs[p.leader])

    def run(self, fn, *args):
        result = fn(c.Tx(self.state, 1_000), *args)
        self.state.check_invariants()
        return result

    @property
    def p(self):
        return self.state.topics["t"].partitions[0]

    @property
    def stream(self):
        return self.state.streams[self.sid]

    def restart(self, node: int) -> None:
        self.epochs[node] = self.run(c.register_broker, node, EP, None)


def test_graceful_move_completes_when_the_stream_closes():
    k = Cluster()
    e0 = k.p.leader_epoch
    k.run(c.reassign_partition, "t", 0, k.target)
    assert (k.p.state, k.p.leader, k.p.target) == ("moving", k.old, k.target)
    # closing the stream is the handover: no partition_closed needed (its answer may be lost)
    k.run(c.close_stream, k.sid, e0, k.old, k.epochs[k.old])
    assert (k.p.state, k.p.leader, k.p.leader_epoch) == ("online", k.target, e0 + 1)
    k.run(c.partition_closed, "t", 0, k.old, k.epochs[k.old], e0)  # a late confirmation changes nothing
    assert (k.p.leader, k.p.leader_epoch) == (k.target, e0 + 1)


def test_old_leader_restarts_before_it_is_fenced():
    """The issue's case: the restarted broker never opened the stream in this life; it
    releases it (after replaying its WAL into it) and the move completes."""
    k = Cluster()
    e0 = k.p.leader_epoch
    k.run(c.reassign_partition, "t", 0, k.target)
    k.restart(k.old)
    assert (k.p.state, k.p.leader) == ("moving", k.old)
    assert (k.stream.state, k.stream.owner) == ("open", k.old)  # its WAL replay commits into it
    k.run(c.close_stream, k.sid, e0, k.old, k.epochs[k.old])
    assert (k.p.state, k.p.leader, k.p.leader_epoch) == ("online", k.target, e0 + 1)


def test_old_leader_fenced_mid_move_keeps_the_target_and_resumes_when_back():
    k = Cluster()
    e0 = k.p.leader_epoch
    k.run(c.reassign_partition, "t", 0, k.target)
    k.run(c.fence_broker, k.old)
    assert (k.p.state, k.p.leader, k.p.target) == ("offline", -1, k.target)
    assert k.state.pending_job_for(k.old) is not None  # its WAL holds acknowledged data
    k.restart(k.old)
    # only the owner may hold the stream while it replays its WAL; the move resumes from it
    assert (k.p.state, k.p.leader, k.p.leader_epoch, k.p.target) == ("moving", k.old, e0, k.target)
    k.run(c.close_stream, k.sid, e0, k.old, k.epochs[k.old])
    assert (k.p.state, k.p.leader, k.p.leader_epoch) == ("online", k.target, e0 + 1)


def test_owner_may_release_its_stream_under_a_newer_leader_epoch():
    """Placed back on its owner at a newer epoch, the owner died before reopening: it can
    still release the stream it holds under the older epoch; nobody else can."""
    k = Cluster()
    e0 = k.p.leader_epoch
    k.run(c.fence_broker, k.old)
    k.restart(k.old)
    assert (k.p.state, k.p.leader, k.p.leader_epoch) == ("online", k.old, e0 + 1)
    try:
        k.run(c.close_stream, k.sid, e0 + 1, k.bystander, k.epochs[k.bystander])
    except StreamNotOpenError:
        pass
    else:
        raise AssertionError("a non-owner closed the stream")
    k.run(c.close_stream, k.sid, e0 + 1, k.old, k.epochs[k.old])
    assert k.stream.state == "closed"


def test_old_leader_dead_for_good_wal_recovered_elsewhere_completes_the_move():
    k = Cluster()
    e0 = k.p.leader_epoch
    k.run(c.reassign_partition, "t", 0, k.target)
    k.run(c.fence_broker, k.old)
    job = k.state.pending_job_for(k.old)
    k.run(c.claim_wal_recovery, job.job_id, k.bystander, k.epochs[k.bystander])
    k.run(c.complete_wal_recovery, job.job_id, k.bystander, k.epochs[k.bystander])
    assert (k.p.state, k.p.leader, k.p.leader_epoch) == ("online", k.target, e0 + 1)


def test_target_fenced_before_the_handover_goes_elsewhere():
    k = Cluster()
    k.run(c.reassign_partition, "t", 0, k.target)
    k.run(c.fence_broker, k.target)
    assert (k.p.state, k.p.target) == ("moving", -1)
    k.run(c.close_stream, k.sid, k.p.leader_epoch, k.old, k.epochs[k.old])
    assert k.p.state == "online" and k.p.leader in (k.old, k.bystander)


def test_target_dies_after_the_handover_before_opening_is_replaced():
    k = Cluster()
    k.run(c.reassign_partition, "t", 0, k.target)
    k.run(c.close_stream, k.sid, k.p.leader_epoch, k.old, k.epochs[k.old])
    assert (k.p.leader, k.p.state) == (k.target, "online")
    e1 = k.p.leader_epoch
    k.run(c.fence_broker, k.target)  # it never opened the stream: nothing to recover
    assert k.p.state == "online" and k.p.leader in (k.old, k.bystander) and k.p.leader_epoch == e1 + 1


def test_target_dies_after_opening_waits_for_its_wal_then_is_replaced():
    k = Cluster()
    k.run(c.reassign_partition, "t", 0, k.target)
    k.run(c.close_stream, k.sid, k.p.leader_epoch, k.old, k.epochs[k.old])
    k.run(c.open_stream, k.sid, k.p.leader_epoch, k.target, k.epochs[k.target])
    k.run(c.fence_broker, k.target)
    assert (k.p.state, k.p.leader) == ("offline", -1)
    job = k.state.pending_job_for(k.target)
    k.run(c.claim_wal_recovery, job.job_id, k.old, k.epochs[k.old])
    k.run(c.complete_wal_recovery, job.job_id, k.old, k.epochs[k.old])
    assert k.p.state == "online" and k.p.leader in (k.old, k.bystander)


def test_state_machine_survives_a_snapshot_mid_move():
    """A controller that takes over mid-move (from a snapshot) drives the same move."""
    k = Cluster()
    e0 = k.p.leader_epoch
    k.run(c.reassign_partition, "t", 0, k.target)
    k.run(c.fence_broker, k.old)
    k.state = MetadataState.from_snapshot(k.state.snapshot())
    k.restart(k.old)
    k.run(c.close_stream, k.sid, e0, k.old, k.epochs[k.old])
    assert (k.p.state, k.p.leader) == ("online", k.target)


def test_topic_created_while_every_broker_drains_is_placed_on_undrain():
    """Found by the state-machine property test: with every broker draining a new topic has no
    leader, and undraining a broker must place it (it used to stay offline until some broker
    registered again)."""
    cluster = Cluster()
    for node in (1, 2, 3):
        cluster.run(c.drain_broker, node)
    created = cluster.run(c.create_topic, "late", 1, {}).partitions[0]
    assert created.leader == -1
    cluster.run(c.undrain_broker, 2)
    p = cluster.state.topics["late"].partitions[0]
    assert (p.state, p.leader) == ("online", 2)
