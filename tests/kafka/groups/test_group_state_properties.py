"""Random client behaviour against the group state machine (hypothesis stateful testing):
members join, sync, heartbeat, commit, leave or go silent while time passes. Invariants hold
after every step, and once clients stop, every waiting request gets an answer."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.state import GroupConfig, GroupManager, GroupState, JoinResult, SyncResult

CLIENTS = 4
PROTOCOLS = [
    [("range", b"r")],
    [("roundrobin", b"o"), ("range", b"r")],
    [("range", b"r"), ("sticky", b"s")],
]


class Client:
    def __init__(self, name: str) -> None:
        self.name = name
        self.member_id = ""
        self.generation = -1
        self.leader = False
        self.members: list[str] = []


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = GroupManager(
            GroupConfig(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=500), num_partitions=1
        )
        self.now = 0
        self.clients = [Client(f"c{i}") for i in range(CLIENTS)]
        self.outstanding: dict[int, tuple[str, Client]] = {}  # token -> (kind, client)
        self.answered: set[int] = set()
        self.next_token = 0
        self.max_generation = 0

    def _token(self, kind: str, client: Client) -> int:
        self.next_token += 1
        self.outstanding[self.next_token] = (kind, client)
        return self.next_token

    def _apply(self, fx) -> None:
        for token, result in fx.replies:
            assert token not in self.answered, "a request was answered twice"
            self.answered.add(token)
            kind, client = self.outstanding.pop(token)
            if kind == "join":
                assert isinstance(result, JoinResult)
                if result.error in (ErrorCode.none, ErrorCode.member_id_required):
                    client.member_id = result.member_id
                if result.error == ErrorCode.none:
                    client.generation = result.generation_id
                    client.leader = result.leader_id == result.member_id
                    client.members = [m for m, _, _ in result.members]
                elif result.error in (ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id):
                    client.member_id, client.generation = "", -1
            else:
                assert isinstance(result, SyncResult)

    @rule(
        i=st.integers(0, CLIENTS - 1),
        v4=st.booleans(),
        protocols=st.sampled_from(PROTOCOLS),
        session=st.sampled_from([1_000, 5_000, 30_000]),
    )
    def join(self, i: int, v4: bool, protocols, session: int) -> None:
        c = self.clients[i]
        self._apply(
            self.m.join(
                self.now,
                group_id="g",
                member_id=c.member_id,
                group_instance_id=None,
                client_id=c.name,
                client_host="/h",
                session_timeout_ms=session,
                rebalance_timeout_ms=session * 2,
                protocol_type="consumer",
                protocols=protocols,
                require_known_member_id=v4,
                token=self._token("join", c),
            )
        )

    @rule(i=st.integers(0, CLIENTS - 1))
    def sync(self, i: int) -> None:
        c = self.clients[i]
        assignments = {m: m.encode() for m in c.members} if c.leader else {}
        self._apply(
            self.m.sync(
                self.now,
                group_id="g",
                generation_id=c.generation,
                member_id=c.member_id,
                group_instance_id=None,
                protocol_type=None,
                protocol_name=None,
                assignments=assignments,
                token=self._token("sync", c),
            )
        )

    @rule(i=st.integers(0, CLIENTS - 1))
    def heartbeat(self, i: int) -> None:
        c = self.clients[i]
        error = self.m.heartbeat(self.now, "g", c.member_id, None, c.generation)
        assert error in (
            ErrorCode.none,
            ErrorCode.rebalance_in_progress,
            ErrorCode.illegal_generation,
            ErrorCode.unknown_member_id,
        )

    @rule(i=st.integers(0, CLIENTS - 1))
    def commit(self, i: int) -> None:
        c = self.clients[i]
        plan = self.m.prepare_commit(
            self.now,
            group_id="g",
            generation_id=c.generation,
            member_id=c.member_id,
            group_instance_id=None,
            offsets=[("t", 0, self.now, -1, "")],
        )
        if plan.errors[("t", 0)] == ErrorCode.none:
            group = self.m.groups["g"]
            assert c.member_id in group.members or (c.generation < 0 and not group.members)
            self.m.complete_commit(plan, self.now)

    @rule(i=st.integers(0, CLIENTS - 1))
    def leave(self, i: int) -> None:
        c = self.clients[i]
        _, _errors, fx = self.m.leave(self.now, "g", [(c.member_id, None)])
        self._apply(fx)
        c.member_id, c.generation = "", -1

    @rule(ms=st.integers(0, 40_000))
    def advance(self, ms: int) -> None:
        self.now += ms
        self._apply(self.m.tick(self.now))

    @invariant()
    def group_is_consistent(self) -> None:
        group = self.m.groups.get("g")
        if group is None:
            return
        assert group.generation_id >= self.max_generation, "generation went backwards"
        self.max_generation = group.generation_id
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert group.leader_id in group.members
            assert group.protocol_name in group.candidate_protocols()
            assert all(not m.awaiting_join for m in group.members.values()), "a join waits outside a rebalance"
        if group.state is GroupState.EMPTY:
            assert not group.members
        if group.state is not GroupState.COMPLETING_REBALANCE:
            assert all(m.sync_token is None for m in group.members.values()), "a sync waits outside CompletingRebalance"
        if group.members:
            assert group.leader_id in group.members
        for token, (kind, _client) in self.outstanding.items():
            holder = [m for m in group.members.values() if token in (m.join_token, m.sync_token)]
            assert len(holder) == 1, f"waiting {kind} request {token} is not held by exactly one member"

    def teardown(self) -> None:
        # clients stop: time passes beyond every timeout; nothing may wait forever
        for _ in range(20):
            self.now += 10 * 60_000
            self._apply(self.m.tick(self.now))
        assert not self.outstanding, f"requests never answered: {self.outstanding}"
        group = self.m.groups.get("g")
        assert group is None or (group.state is GroupState.EMPTY and not group.members and not group.pending_members)
        assert self.m.next_deadline() is None, "a timer is still armed for a group nobody uses"


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
