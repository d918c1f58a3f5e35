"""A broker in a cluster: the `cluster.SlotHost` of one `Broker`.

`txnbuf serve --store postgresql://... --cluster` runs a broker whose store
holds no slot at start. `ClusterHost` joins the cluster's membership
(`cluster.PostgresMembership`, a lease of ``--lease-ttl`` seconds by the
database's clock) and runs `cluster.Member`, which takes this broker's share
of the slots and calls back here:

- `load` (slot k taken at epoch e): the store writes slot k's ledgers at e
  from now on and re-reads their catalog (`LedgerStore.hold_slot`); the
  topic list of the slot is read (`buffer.Topics.load_slot`, deleting what
  an interrupted deletion left); the ACL's ledger becomes writable here if k
  is 0; then coordinator k opens and recovers from its log as at a start
  (OPEN transactions aborted, decided ones finished) and the slot's topics
  load on first use, each recovering its pending acks and aborting what
  its coordinator will not commit;
- `unload` (slot k handed over): commands on it are refused from then on,
  coordinator k closes, every connection is closed (their clients
  reconnect; what they had on other slots is served again at once), every
  write queued so far is answered (`LedgerStore.settle`), then the slot's
  topics and ledgers are dropped from memory (`LedgerStore.drop_slot`: any
  later write to them is refused as fenced);
- `drop_all` (the store failed: a write was fenced, or its outcome is
  unknown; or the lease ran out): everything in memory goes, as at a
  restart: connections closed, coordinators and topics dropped, the store
  closed and opened again with no slot, the ACL read again. The broker
  never goes on with a store that refused a write. While the store cannot
  be opened again (the PostgreSQL primary died, and no server is writable
  yet: a standby not promoted yet), the opening is tried again with a
  backoff (`REOPEN_FIRST` doubling to `REOPEN_MOST` seconds), logged at
  WARNING on the first failure and every `REOPEN_LOG_EVERY` seconds after;
  the broker serves no slot meanwhile (every command is refused NOT_OWNER,
  retriable). After ``store_wait`` seconds with no success it gives up:
  ERROR, `gave_up` is done, and `txnbuf serve` exits with status 1 (a
  supervisor restarts it). A URL naming a primary and its standbys connects
  to whichever is writable (`ledger._postgres.connect_options`), so the
  store reopened after a promotion is the new primary's.

A command on a topic or a coordinator of a slot not served here is refused
with `refusals.NotOwner` (retriable) naming the slot and, if the last look
at the tables saw one, the owner's URLs (``gate``, ``coordinator_not_here``).
The broker-wide records are slot 0's ledgers: the ACL (``__meta/acl``) is
written by the owner of slot 0 only (a grant or revoke elsewhere is refused
NotOwner, naming it) and read again from the store by the others at each
look; the metrics' counters are not kept in a cluster (each broker counts
from its start); each slot has its own topic list (`buffer._topics`).
Transactions across brokers (`broker._peers`): the host holds the
connections to the other brokers (`peers`, made at start with the
cluster's secret from the database) and fences ENDs from coordinators on
other brokers against the tables' slot epochs (`fence_coordinator`).

Nudges: when this broker's look changed the tables so that the others have
something to do (it joined, released slots, or left on SIGTERM), it asks
each other live broker of the view that look read to look now
(``POST /admin/v1/cluster/look`` at its advertised URL, as the role
``cluster``: `broker._admin_cluster`), in the background, each request
given up after `NUDGE_TIMEOUT` (failures logged at DEBUG); a drain waits
for its nudges that long at most before the process exits. A nudged
broker looks at once (`cluster.Member.nudge`, coalesced and rate-limited).
Best effort only: a lost nudge costs the wait for the next look.
docs/cluster.md has the decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
import urllib.parse

import aiohttp

from broker._auth import ACL_LEDGER, NUDGE_PATH, read_acl
from broker._broker import Broker
from broker._errors import cluster_store_failures
from broker._peers import Peers
from broker._slots import slot_of, slot_of_key
from buffer import Topics
from cluster import LeaseTiming, Member, MembershipError, PostgresMembership, View
from cluster._postgres import KAFKA_SCHEME
from ledger import LedgerError, LedgerStore
from ledger._postgres import connect_options, redacted
from proto import refusals
from subscriptions import Subscriptions
from tc import ProducerSettings

__all__ = ["DEFAULT_STORE_WAIT", "ClusterHost", "StoreUnavailable"]

log = logging.getLogger(__name__)

CLOSE_WAIT = 10.0  # seconds a dropped store may take to close before it is abandoned
FIRST_LOOKS = 3  # looks before a starting broker listens: join, take, (renew)
FRESH_EVERY = 0.1  # seconds between two reads of the tables for lookups, at least
DEFAULT_STORE_WAIT = 120.0  # seconds a dropped broker tries to reopen its store (--store-wait)
REOPEN_FIRST = 0.1  # seconds before the second attempt to reopen the store
REOPEN_MOST = 1.0  # seconds between two attempts, at most
REOPEN_LOG_EVERY = 10.0  # seconds between two warnings while the store cannot be reopened
NUDGE_TIMEOUT = 1.0  # seconds a nudge may take before it is given up
# Set to "0" in a broker's environment: it nudges nobody (measurements of
# what the nudges save; docs/cluster.md). Nudges it receives still wake it.
NUDGE_ENV = "TXNBUF_CLUSTER_NUDGE"


class StoreUnavailable(LedgerError):
    """No writable server answered the store's URL for ``store_wait``
    seconds: the broker gives up (`ClusterHost.gave_up`)."""


class ClusterHost:
    """The membership of one cluster broker and the slots it serves (see the
    module docstring). Create with `start`; `drain` on SIGTERM, `close`."""

    def __init__(
        self,
        broker: Broker,
        membership: PostgresMembership,
        store_url: str,
        lease: LeaseTiming,
        producer_settings: ProducerSettings | None = None,
        kafka: str | None = None,
        store_wait: float = DEFAULT_STORE_WAIT,
        tls_ca: ssl.SSLContext | None = None,
    ) -> None:
        self.broker = broker
        # What this broker trusts when it connects to the others over https
        # (`Peers`, the admin API's forwarding); None: the system's CAs.
        self.tls_ca = tls_ca
        self.membership = membership
        self.store_url = store_url
        self.producer_settings = producer_settings
        self.me = broker.store_owner
        self.served: set[int] = set()  # slots whose commands are taken here
        # (the membership row's urls: the service URL, then the Kafka
        # listener's address, `cluster.kafka_address`)
        urls = broker.url if kafka is None else f"{broker.url},{KAFKA_SCHEME}{kafka}"
        self.member = Member(membership, self.me, urls, self, lease, changed=self._nudge_others)
        self.nudging = os.environ.get(NUDGE_ENV, "1") != "0"
        self._nudges: set[asyncio.Task[None]] = set()  # nudges under way
        self._session: aiohttp.ClientSession | None = None  # (for the nudges)
        self._run: asyncio.Task[None] | None = None
        self._acl_refresh: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[object] | None = None  # a read of the tables for lookups
        self._read_at = 0.0
        self.drops = 0  # drop_all since start, for stats and tests
        self._peers: Peers | None = None  # (made by `start`: it needs the cluster's secret)
        self.store_wait = store_wait
        # Done (with the reason) when the store could not be reopened within
        # store_wait: `txnbuf serve` exits with status 1.
        self.gave_up: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Figures since start, for /metrics (`broker._metrics`).
        self.loads = 0  # slots loaded
        self.unloads = 0  # slots handed over (a balance's release or a drain)
        self.handovers = 0  # of which while draining (SIGTERM)
        self.not_owner_refusals = 0  # NOT_OWNER refusals made (commands and lookups)
        self.stale_ends = 0  # ENDs from another broker refused for their slot epoch
        self.nudges_sent = 0  # nudges sent to other brokers
        self.nudge_failures = 0  # of which not answered 200 within NUDGE_TIMEOUT
        broker.cluster = self
        self._watch_store()

    @classmethod
    async def start(
        cls,
        broker: Broker,
        store_url: str,
        lease: LeaseTiming,
        producer_settings: ProducerSettings | None = None,
        kafka: str | None = None,
        store_wait: float = DEFAULT_STORE_WAIT,
        tls_ca: ssl.SSLContext | None = None,
    ) -> ClusterHost:
        """Join, take this broker's first share and load it (a few looks),
        then keep looking in the background. ``kafka``: the ``host:port``
        Kafka clients reach this broker's Kafka listener at (recorded with
        its membership, so that the others' Kafka listeners name it);
        ``tls_ca``: the CAs to trust at the other brokers (``--cluster-tls-ca``)."""
        try:
            membership = await PostgresMembership.open(store_url, **connect_options(store_url))
        except MembershipError as exc:
            raise LedgerError(str(exc)) from exc
        cluster_store_failures()  # (a store out of service: NOT_OWNER, retriable)
        host = cls(
            broker, membership, store_url, lease, producer_settings, kafka, store_wait, tls_ca
        )
        try:
            secret = await membership.secret()
        except MembershipError as exc:
            await membership.close()
            raise LedgerError(str(exc)) from exc
        host._peers = Peers(host, secret, tls_ca)
        broker.security.cluster_secret = secret
        for _ in range(FIRST_LOOKS):
            await host.member.tick()
        await host.member.loads_done()
        host._run = asyncio.get_running_loop().create_task(host.member.run())
        host._acl_refresh = asyncio.get_running_loop().create_task(host._refresh_acl())
        log.info(
            "joined the cluster as %r (lease %.1fs): serving slots %s",
            host.me,
            lease.ttl,
            _ranges(host.served),
        )
        return host

    # -- refusals ---------------------------------------------------------------------

    def _not_owner(self, slot: int, what: str, counted: bool = True) -> refusals.NotOwner:
        """The refusal (``counted``: one made, for the metrics; not when the
        caller asks again before answering)."""
        self.not_owner_refusals += counted
        view = self.membership.last_view
        owner = view.slots[slot].owner if view is not None and slot < len(view.slots) else None
        urls = self.membership.last_urls.get(owner, "") if owner is not None else ""
        if owner is None:
            where = "no broker owns it now (it is being taken over)"
        elif owner == self.me:
            where = "this broker is taking it over or handing it over"
        elif view is not None and not view.is_live(owner):
            where = f"the lease of its owner {owner} ran out (it is being taken over)"
        else:
            where = f"it is owned by {owner}" + (f" at {urls}" if urls else "")
        return refusals.NotOwner(
            f"{what} is in slot {slot}, which this broker does not serve: {where}; "
            "try again at its owner",
            slot,
            urls if owner != self.me else "",
        )

    def not_owner(self, slot: int, what: str) -> refusals.NotOwner:
        """The refusal of a request about ``what``, in ``slot``, not served here."""
        return self._not_owner(slot, what)

    def gate(self, topic: str) -> None:
        slot = slot_of_key(topic, self.broker.store.slot_count)
        if slot not in self.served:
            raise self._not_owner(slot, f"topic {topic!r}")

    def serves(self, topic: str) -> bool:
        return slot_of_key(topic, self.broker.store.slot_count) in self.served

    @property
    def peers(self) -> Peers:
        assert self._peers is not None, "the cluster host has not started"
        return self._peers

    async def fence_coordinator(self, tcid: int, epoch: int, what: str) -> None:
        """Coordinator ``tcid``'s END of ``what`` comes at slot epoch
        ``epoch``: taken only if that is the slot's epoch in the cluster
        tables (the last look, or, if it differs, the tables read again
        now); else refused, nothing changed. An older epoch (or none) is a
        broker that lost the coordinator's slot (paused, partitioned): it
        cannot end a transaction here (NOT_ALLOWED; it stops telling, the
        new owner tells). A newer one than the tables hold is a takeover
        this broker has not seen yet (SERVICE_NOT_READY: its coordinator
        tries again soon), or made up."""
        slot = tcid % self.broker.store.slot_count
        now = self._slot_epoch(slot)
        if now != epoch:
            await self._fresh()
            now = self._slot_epoch(slot)
        if now == epoch and epoch != 0:
            return
        if epoch != 0 and (now is None or epoch > now):
            # (A takeover this broker has not seen yet: its last look, even
            # read again, may be a moment old. A made-up epoch gets the same
            # answer, and changes nothing either.)
            raise refusals.ServiceNotReady(
                f"end of {what} refused for now: it comes from coordinator {tcid} at epoch "
                f"{epoch} of slot {slot}, newer than this broker has seen in the cluster tables "
                f"({now}); nothing was changed; try again"
            )
        self.stale_ends += 1
        raise refusals.NotAllowed(
            f"end of {what} refused: it comes from coordinator {tcid} at epoch {epoch} of "
            f"slot {slot}, and the cluster tables have that slot at epoch {now} (the END "
            "is not from its owner); nothing was changed",
        )

    def slot_epoch_seen(self, slot: int) -> int | None:
        """``slot``'s epoch in the last look at the cluster tables (None: none yet)."""
        return self._slot_epoch(slot)

    def _slot_epoch(self, slot: int) -> int | None:
        view = self.membership.last_view
        return view.slots[slot].epoch if view is not None and slot < len(view.slots) else None

    def coordinator_not_here(self, tcid: int) -> refusals.Refusal:
        slots = self.broker.store.slot_count
        return self._not_owner(tcid % slots, f"transaction coordinator {tcid}")

    async def topic_owner(self, topic: str) -> str:
        slot = slot_of_key(topic, self.broker.store.slot_count)
        return await self._owner_url(slot, f"topic {topic!r}")

    async def coordinator_owner(self, tcid: int) -> str:
        slot = tcid % self.broker.store.slot_count
        return await self._owner_url(slot, f"transaction coordinator {tcid}")

    async def _owner_url(self, slot: int, what: str) -> str:
        """LOOKUP: "" (served here), or the URL of the slot's owner as the
        last look at the tables saw it. When that look names no live owner
        (a failover under way), the tables are read again first (`_fresh`),
        so that a slot just taken over is found at once rather than at this
        broker's next look."""
        try:
            return self._owner_seen(slot, what, counted=False)
        except refusals.NotOwner:
            await self._fresh()
            return self._owner_seen(slot, what)

    async def _fresh(self) -> None:
        """Read the cluster tables again, for lookups (one read at a time,
        shared by the lookups waiting for it, at most every `FRESH_EVERY`
        seconds)."""
        loop = asyncio.get_running_loop()
        reading = self._reading
        if reading is None or (reading.done() and loop.time() - self._read_at >= FRESH_EVERY):
            reading = self._reading = loop.create_task(self.membership.read())
            self._read_at = loop.time()
        try:
            await asyncio.shield(reading)
        except Exception as exc:  # (answered from the last look)
            log.debug("reading the cluster tables for a lookup failed: %s", exc)

    async def fresh_view(self) -> None:
        """`_fresh`, for `broker._peers.Peers`."""
        await self._fresh()

    def owner_seen(self, slot: int, what: str) -> str:
        """`_owner_seen`, for `broker._peers.Peers` (its looks are not
        refusals: not counted)."""
        return self._owner_seen(slot, what, counted=False)

    def _owner_seen(self, slot: int, what: str, counted: bool = True) -> str:
        """`_owner_url` from the last look only: `refusals.NotOwner`
        (retriable) if it saw no owner, or one whose lease had run out (it
        is being taken over), or this broker (loading or handing over)."""
        if slot in self.served:
            return ""
        view = self.membership.last_view
        owner = view.slots[slot].owner if view is not None and slot < len(view.slots) else None
        url = self.membership.last_urls.get(owner, "") if owner is not None else ""
        if owner is None or owner == self.me or not url or not view or not view.is_live(owner):
            raise self._not_owner(slot, what, counted)
        return url

    def acl_not_writable(self) -> Exception:
        return self._not_owner(slot_of(ACL_LEDGER, self.broker.store.slot_count) or 0, "the ACL")

    # -- the SlotHost -----------------------------------------------------------------

    async def load(self, slot: int, epoch: int) -> None:
        t0 = time.perf_counter()
        broker = self.broker
        store = broker.store
        await store.hold_slot(slot, epoch)
        for name in await broker.topics.load_slot(slot):  # (a deletion interrupted)
            await broker.subscriptions.delete_leftovers(name)
            await broker.topics.delete_ledgers(name)
        if slot == slot_of(ACL_LEDGER, store.slot_count):
            acl = broker.security.acl
            ledger = await store.open_ledger(ACL_LEDGER)
            ledger.no_tail_cache()
            acl.replace_entries(await read_acl(store))
            acl.ledger = ledger
        self.served.add(slot)
        tc = await broker._open_coordinator(slot, self.producer_settings)
        if store is not broker.store or slot not in self.served:  # (dropped meanwhile)
            await tc.close()
            return
        broker.coordinators[slot] = tc
        self.loads += 1
        log.info(
            "serving slot %d at epoch %d (%d topics) in %.2fs",
            slot,
            epoch,
            sum(1 for n in broker.topics.names() if slot_of_key(n, store.slot_count) == slot),
            time.perf_counter() - t0,
        )

    async def unload(self, slot: int) -> None:
        broker = self.broker
        store = broker.store
        self.served.discard(slot)
        if self._peers is not None:
            self._peers.forget_all()
        tc = broker.coordinators.pop(slot, None)
        if tc is not None:
            await tc.close()
        await self._close_connections()
        await store.settle()
        broker.topics.drop_slot(slot)
        if slot == slot_of(ACL_LEDGER, store.slot_count):
            broker.security.acl.ledger = None
        store.drop_slot(slot)
        self.unloads += 1
        self.handovers += self.member.draining
        log.info("handed slot %d over", slot)

    async def drop_all(self, reason: str) -> None:
        """Start again from the store, as a restart would."""
        self.drops += 1
        broker = self.broker
        log.warning("dropping everything held in memory and starting again: %s", reason)
        self.served.clear()
        if self._peers is not None:
            self._peers.forget_all()
        await self._close_connections()
        for tc in list(broker.coordinators.values()):
            await tc.close()
        broker.coordinators.clear()
        await broker.topics.close()
        for topic in broker.topics.all():
            broker.subscriptions.unload_topic(topic.name)
        try:
            await broker.subscriptions.close()
        except Exception as exc:  # (its store failed: nothing more to write)
            log.warning("closing the dropped subscriptions failed: %s", exc)
        old = broker.store
        try:
            await asyncio.wait_for(old.close(), CLOSE_WAIT)
        except (Exception, TimeoutError) as exc:
            log.warning("closing the dropped store failed: %s", exc)
        await self._reopen()
        # (Again: a connection accepted since the first close may hold a
        # producer or consumer of a topic of the store just dropped.)
        await self._close_connections()
        self._watch_store()

    async def _reopen(self) -> None:
        """Open the store again, with no slot, and read its topic lists and
        the ACL; tried again while it fails (no writable server yet), up to
        ``store_wait`` seconds, then `StoreUnavailable` (see the module
        docstring)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = REOPEN_FIRST
        attempts = 0
        warned = float("-inf")
        where = redacted(self.store_url)
        while True:
            attempts += 1
            try:
                await self._open_store()
            except Exception as exc:
                waited = loop.time() - started
                if waited >= self.store_wait:
                    reason = (
                        f"no writable PostgreSQL server at {where} for {waited:.1f}s "
                        f"({attempts} attempts; the last: {exc})"
                    )
                    log.error("%s: this broker stops (status 1)", reason)
                    if not self.gave_up.done():
                        self.gave_up.set_result(reason)
                    self.member.stop()
                    raise StoreUnavailable(reason) from exc
                if loop.time() - warned >= REOPEN_LOG_EVERY:
                    warned = loop.time()
                    log.warning(
                        "cannot reopen the store at %s (attempt %d, %.1fs so far; trying "
                        "again for up to %.0fs, serving no slot meanwhile): %s",
                        where,
                        attempts,
                        waited,
                        self.store_wait,
                        exc,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, REOPEN_MOST)
                continue
            if attempts > 1:
                log.warning(
                    "reopened the store at %s after %d attempts in %.1fs",
                    where,
                    attempts,
                    loop.time() - started,
                )
            return

    async def _open_store(self) -> None:
        broker = self.broker
        store = await LedgerStore.open(self.store_url, owner=self.me, slot_of=slot_of)
        try:
            count = store.slot_count
            topics = await Topics.load(
                store, lazy=True, slots=count, slot_of=lambda name: slot_of_key(name, count)
            )
            subs = await Subscriptions.load(topics)
            acl = await read_acl(store)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(store.close(), CLOSE_WAIT)
            raise
        topics.prepare = broker._prepare_topic
        topics.discard = broker._discard_topic
        topics.gate = self.gate
        broker.store, broker.topics, broker.subscriptions = store, topics, subs
        broker.reset_connections_state()
        broker.security.acl.ledger = None
        broker.security.acl.replace_entries(acl)

    # -- for operators ----------------------------------------------------------------

    @property
    def loading(self) -> set[int]:
        """Slots taken and not served yet (being loaded)."""
        return set(self.member.held) - self.served

    def owner_url(self, owner: str | None) -> str:
        """The admin URL (http or https) of ``owner`` as the last look saw it ("": none)."""
        if owner is None:
            return ""
        urls = self.membership.last_urls.get(owner, "")
        return next((u.strip() for u in urls.split(",") if u.strip().startswith("http")), "")

    async def admin_owner(self, slot: int, what: str) -> str:
        """The admin URL of the live owner of ``slot`` ("" if this broker
        serves it), reading the tables again during a failover (as a
        LOOKUP); `refusals.NotOwner` (retriable) when no live broker owns it."""
        if slot in self.served:
            return ""
        await self._owner_url(slot, what)
        view = self.membership.last_view
        assert view is not None
        return self.owner_url(view.slots[slot].owner)

    def figures(self) -> dict[str, float | None]:
        """For /metrics (`broker._metrics.ClusterFigures`)."""
        renewed = self.member.renewed_at
        now = asyncio.get_running_loop().time()
        return {
            "slots_owned": len(self.member.held),
            "slots_loading": len(self.loading),
            "loads": self.loads,
            "unloads": self.unloads,
            "handovers": self.handovers,
            "failovers": self.member.failovers,
            "drops": self.drops,
            "not_owner_refusals": self.not_owner_refusals,
            "renewals": self.member.renewals,
            "renewal_age": None if renewed is None else now - renewed,
            "peer_tells": self.peers.tells if self._peers is not None else 0,
            "peer_checks": self.peers.checks if self._peers is not None else 0,
            "stale_end_refusals": self.stale_ends,
            "nudges_sent": self.nudges_sent,
            "nudge_failures": self.nudge_failures,
            "nudges_received": self.member.nudges,
        }

    def labeled_figures(self) -> dict[str, dict[str, int]]:
        """For /metrics (`broker._metrics.ClusterFigures`): the peers' figures
        by reason."""
        peers = self._peers
        if peers is None:
            return {}
        return {
            "peer_tell_retries": dict(peers.tell_retries),
            "peer_tell_failures": dict(peers.tell_failures),
            "peer_check_retries": dict(peers.check_retries),
            "peer_check_refusals": dict(peers.check_refusals),
        }

    async def live_others(self) -> dict[str, str]:
        """The other live brokers and their admin URLs, from the tables read now."""
        await self._fresh()
        view = self.membership.last_view
        if view is None:
            return {}
        return {
            b: self.owner_url(b)
            for b in sorted(view.brokers)
            if b != self.me and view.is_live(b) and self.owner_url(b)
        }

    # -- nudges -----------------------------------------------------------------------

    def _nudge_others(self, view: View, what: str) -> None:
        """`cluster.Member`'s ``changed``: ask every other live broker of
        ``view`` (with an advertised URL) to look now, in the background."""
        if not self.nudging or self._peers is None:
            return
        loop = asyncio.get_running_loop()
        for other in view.live():
            url = self.owner_url(other) if other != self.me else ""
            if not url:
                continue
            task = loop.create_task(self._nudge(other, url, what))
            self._nudges.add(task)
            task.add_done_callback(self._nudges.discard)

    async def _nudge(self, other: str, url: str, what: str) -> None:
        self.nudges_sent += 1
        try:
            host = urllib.parse.urlsplit(url).hostname or ""
            if host in ("0.0.0.0", "::"):
                raise OSError(f"{url} is a wildcard address no other broker can reach")
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession()
            async with self._session.post(
                url.rstrip("/") + NUDGE_PATH,
                json={"from": self.me},
                headers={"Authorization": f"Bearer {self.peers.token}"},
                timeout=aiohttp.ClientTimeout(total=NUDGE_TIMEOUT),
                ssl=self.tls_ca if self.tls_ca is not None else True,
            ) as answer:
                if answer.status != 200:
                    text = (await answer.read()).decode(errors="replace")[:300]
                    raise OSError(f"answered {answer.status}: {text}")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.nudge_failures += 1
            log.debug("nudging %s at %s (%s) failed: %r", other, url, what, exc)
        else:
            log.debug("nudged %s at %s (%s)", other, url, what)

    async def _nudges_sent(self) -> None:
        """Wait for the nudges under way, `NUDGE_TIMEOUT` at most (each ends
        within it; `close` cancels what is left)."""
        if self._nudges:
            await asyncio.wait(set(self._nudges), timeout=NUDGE_TIMEOUT)

    # -- the rest ---------------------------------------------------------------------

    def _watch_store(self) -> None:
        broker = self.broker
        broker.topics.gate = self.gate
        broker.security.acl.not_writable = self.acl_not_writable
        store = broker.store

        def failed(failure: asyncio.Future[LedgerError]) -> None:
            if store is self.broker.store and not failure.cancelled():
                log.error("the store failed: %s", failure.result())
                # From now on this broker serves no slot (commands and
                # lookups are refused NOT_OWNER, retriable), and before the
                # requests the store failed are answered (their futures'
                # callbacks run after this one) every connection stops
                # answering: those answers are dropped, and each client
                # re-sends what was not answered once it reconnects, as
                # after a crash (deduplicated). The sockets close in
                # `drop_all`.
                self.served.clear()
                for conn in list(self.broker.connections):
                    conn.close()
                self.member.store_failed()

        store.failure.add_done_callback(failed)

    async def _close_connections(self) -> None:
        for conn in list(self.broker.connections):
            await conn.shut()

    async def _refresh_acl(self) -> None:
        """Read the ACL again every renewal interval, unless this broker
        writes it (it owns its slot)."""
        failing = False
        while True:
            await asyncio.sleep(self.member.lease.renew_every)
            acl = self.broker.security.acl
            if acl.ledger is not None:
                continue
            try:
                acl.replace_entries(await read_acl(self.broker.store))
            except Exception as exc:  # (a warning for the first failure of a run)
                log.log(
                    logging.DEBUG if failing else logging.WARNING, "reading the ACL failed: %s", exc
                )
                failing = True
            else:
                failing = False

    async def drain(self) -> bool:
        """SIGTERM: hand every slot over at once and leave the cluster."""
        if self._run is not None:
            self.member.stop()
            await asyncio.gather(self._run, return_exceptions=True)
        done = await self.member.drain()
        log.info("handed over every slot and left the cluster" if done else "leaving failed")
        await self._nudges_sent()  # (so that the others take the slots now)
        return done

    async def close(self) -> None:
        for task in list(self._nudges):
            task.cancel()
        await asyncio.gather(*self._nudges, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._peers is not None:
            await self._peers.close()
        if self._acl_refresh is not None:
            self._acl_refresh.cancel()
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
        if self._run is not None:
            self.member.stop()
            self._run.cancel()
            await asyncio.gather(self._run, return_exceptions=True)
        await self.membership.close()


def _ranges(slots: set[int]) -> str:
    """``0-3,7,9-10``."""
    out: list[str] = []
    for k in sorted(slots):
        if out and out[-1].split("-")[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ",".join(out) or "none"
