"""The operator's one door to the AutoMQ controller: drain and undrain brokers; on node loss,
ask whether a broker is silent, fence it and follow its WAL recovery; for balancing and
autoscaling, read the cluster metadata, move partitions, unregister brokers removed by scale-in.

It wraps `automq.broker.controller.client.ControllerClient` (which follows the active
controller) and narrows it to what the reconciler needs, so tests inject a recording
implementation and later features (balancing, node-loss fencing) add methods here.

Every failure surfaces as `ControllerApiError` with the reason, whatever the client raised,
so the reconciler decides once what an unreachable controller means (wait and report).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from automq.broker.controller.acls import AclBinding, AclFilter
from automq.broker.controller.protocol import BrokerNotAvailableError, MetadataImage, ScramCredentialInfo


class ControllerApiError(Exception):
    """The controller could not be asked (unreachable, no leader yet) or refused."""


class ControllerApi(Protocol):
    async def drain_broker(self, node_id: int) -> None:
        """Start moving all partition leadership off a broker; place nothing new on it."""

    async def undrain_broker(self, node_id: int) -> None:
        """Let the broker lead partitions again."""

    async def broker_drained(self, node_id: int) -> bool:
        """True once no partition is led by (or still moving off) the broker."""

    # Node loss (automq.operator.nodeloss).

    async def broker_silent(self, node_id: int) -> tuple[bool, str]:
        """Whether the controller agrees the broker stopped: fenced already, or no heartbeat for
        at least half its session timeout. The string says what the controller sees."""

    async def fence_broker(self, node_id: int) -> int:
        """Fence the broker now (idempotent): its epoch is refused, its WAL gets a recovery job.
        Returns the node epoch that is fenced (a later registration has a higher one)."""

    async def wal_recovery_pending(self, node_id: int) -> bool:
        """True while the controller holds a WAL recovery job for the broker."""

    async def offline_partitions(self) -> int:
        """How many partitions have no leader now."""

    async def metadata(self) -> MetadataImage:
        """The current cluster metadata (brokers with their state, partitions with leaders)."""

    async def reassign_partition(self, topic: str, partition: int, target: int) -> None:
        """Start moving a partition's leadership to `target` (what AlterPartitionReassignments does)."""

    async def unregister_broker(self, node_id: int) -> None:
        """A broker removed for good (scale-in): stop counting it as a member of the cluster."""

    # Users (automq.operator.users).

    async def create_acls(self, bindings: list[AclBinding]) -> None:
        """Store the bindings (existing ones are kept once); ControllerApiError if any is refused."""

    async def delete_acls(self, filters: list[AclFilter]) -> None:
        """Delete what the filters match."""

    async def alter_user_quotas(self, user: str, ops: dict[str, float | None]) -> None:
        """Set (a value) or remove (None) quota keys of the `user` quota entity."""

    async def alter_scram(self, deletions: list[tuple[str, str]], upsertions: list[ScramCredentialInfo]) -> None:
        """Delete (user, mechanism) SCRAM credentials and store salted ones."""

    async def close(self) -> None: ...


# Called as factory(urls), or factory(urls, auth=ControllerClientAuth) for a cluster whose
# controller API requires credentials (automq.operator.security.operator_controller_auth).
ControllerApiFactory = Callable[..., ControllerApi]


class ControllerClientApi:
    """ControllerApi over the controller's HTTP API."""

    def __init__(
        self, urls: list[str], *, request_timeout_s: float = 5.0, retry_deadline_s: float = 10.0, auth: Any = None
    ) -> None:
        from automq.broker.controller.client import ControllerClient

        self._client = ControllerClient(
            urls, request_timeout_s=request_timeout_s, retry_deadline_s=retry_deadline_s, auth=auth
        )

    async def drain_broker(self, node_id: int) -> None:
        try:
            await self._client.drain_broker(node_id)
        except Exception as exc:  # every client error means the same here: not drained yet
            raise ControllerApiError(f"drain of broker {node_id} failed: {exc}") from exc

    async def undrain_broker(self, node_id: int) -> None:
        try:
            await self._client.undrain_broker(node_id)
        except Exception as exc:
            raise ControllerApiError(f"undrain of broker {node_id} failed: {exc}") from exc

    async def broker_drained(self, node_id: int) -> bool:
        try:
            image = await self._client.watch_metadata(since_version=-1, timeout_ms=0)
        except Exception as exc:
            raise ControllerApiError(f"cannot read cluster metadata: {exc}") from exc
        for topic in image.topics:
            for partition in topic.partitions:
                if partition.leader == node_id:
                    return False
        return True

    async def broker_silent(self, node_id: int) -> tuple[bool, str]:
        try:
            sessions = await self._client.broker_sessions()
        except Exception as exc:
            raise ControllerApiError(f"cannot read broker sessions: {exc}") from exc
        broker = next((b for b in sessions["brokers"] if b["node_id"] == node_id), None)
        if broker is None:
            return True, f"broker {node_id} is not registered"
        if broker["state"] == "fenced":
            return True, f"broker {node_id} is already fenced"
        age, timeout = broker["heartbeat_age_ms"], sessions["session_timeout_ms"]
        if age is None:
            return False, f"the controller has no session of broker {node_id} yet"
        # Half the session: well past a missed heartbeat or two, before the controller's own fencing.
        silent = age * 2 >= timeout
        return silent, f"the controller last heard broker {node_id} {age} ms ago (session timeout {timeout} ms)"

    async def fence_broker(self, node_id: int) -> int:
        try:
            await self._client.fence_broker(node_id)
            sessions = await self._client.broker_sessions()
        except Exception as exc:
            raise ControllerApiError(f"fencing broker {node_id} failed: {exc}") from exc
        return next((b["node_epoch"] for b in sessions["brokers"] if b["node_id"] == node_id), -1)

    async def wal_recovery_pending(self, node_id: int) -> bool:
        try:
            jobs = await self._client.list_wal_recovery_jobs()
        except Exception as exc:
            raise ControllerApiError(f"cannot list WAL recovery jobs: {exc}") from exc
        return any(job.node_id == node_id for job in jobs)

    async def offline_partitions(self) -> int:
        try:
            image = await self._client.watch_metadata(since_version=-1, timeout_ms=0)
        except Exception as exc:
            raise ControllerApiError(f"cannot read cluster metadata: {exc}") from exc
        return sum(1 for t in image.topics for p in t.partitions if p.leader < 0)

    async def metadata(self) -> MetadataImage:
        try:
            return await self._client.watch_metadata(since_version=-1, timeout_ms=0)
        except Exception as exc:
            raise ControllerApiError(f"cannot read cluster metadata: {exc}") from exc

    async def reassign_partition(self, topic: str, partition: int, target: int) -> None:
        try:
            await self._client.reassign_partition(topic, partition, target)
        except Exception as exc:
            raise ControllerApiError(f"move of {topic}-{partition} to broker {target} refused: {exc}") from exc

    async def unregister_broker(self, node_id: int) -> None:
        try:
            # Fencing is what a graceful exit does (unregister = fence); a broker that exited
            # cleanly already did it, one killed at the end of its grace period did not.
            await self._client.fence_broker(node_id)
        except BrokerNotAvailableError:
            return  # never registered, or forgotten: nothing to unregister
        except Exception as exc:
            raise ControllerApiError(f"unregister of broker {node_id} failed: {exc}") from exc

    async def create_acls(self, bindings: list[AclBinding]) -> None:
        try:
            results = await self._client.create_acls(bindings)
        except Exception as exc:
            raise ControllerApiError(f"creating ACLs failed: {exc}") from exc
        refused = [f"{b}: {message}" for b, (code, message) in zip(bindings, results, strict=True) if code]
        if refused:
            raise ControllerApiError("the controller refused ACLs: " + "; ".join(refused))

    async def delete_acls(self, filters: list[AclFilter]) -> None:
        try:
            results = await self._client.delete_acls(filters)
        except Exception as exc:
            raise ControllerApiError(f"deleting ACLs failed: {exc}") from exc
        refused = [message for (code, message), _ in results if code]
        if refused:
            raise ControllerApiError("the controller refused ACL filters: " + "; ".join(str(m) for m in refused))

    async def alter_user_quotas(self, user: str, ops: dict[str, float | None]) -> None:
        try:
            [(code, message)] = await self._client.alter_client_quotas([([("user", user)], ops)], False)
        except Exception as exc:
            raise ControllerApiError(f"altering the quotas of user {user} failed: {exc}") from exc
        if code:
            raise ControllerApiError(f"the controller refused the quotas of user {user}: {message}")

    async def alter_scram(self, deletions: list[tuple[str, str]], upsertions: list[ScramCredentialInfo]) -> None:
        try:
            results = await self._client.alter_scram_credentials(deletions, upsertions)
        except Exception as exc:
            raise ControllerApiError(f"altering SCRAM credentials failed: {exc}") from exc
        refused = [f"{user}: {r[1]}" for user, r in results.items() if r is not None]
        if refused:
            raise ControllerApiError("the controller refused SCRAM credentials: " + "; ".join(refused))

    async def close(self) -> None:
        await self._client.close()


def connect(urls: list[str], auth: Any = None) -> ControllerApi:
    """The default factory: a client for the cluster's controllers (`auth`: a
    ControllerClientAuth with the cluster's token, when its API requires one)."""
    return ControllerClientApi(urls, auth=auth)
