"""Kafka's transactional producer API (``transactional.id``) on onceflow transactions.

What differs from Kafka, on purpose: ``transaction.timeout.ms`` has no 15-minute ceiling; readers are never
held back by an open transaction (committed data is merged into the target partitions in commit order); a
record's delivery report comes when it is staged, with no offset (offsets are assigned when the transaction
merges); and records bound for a partition that a scale sealed meanwhile are routed by key into the stream's
current epoch when the transaction merges, so a transaction survives a scale of its streams.

Errors carry librdkafka's flags and their meaning: TRANSACTION_TIMED_OUT (the transaction passed
``transaction.timeout.ms`` and the log aborted it) has ``txn_requires_abort()``: the application calls
``abort_transaction()``, which then succeeds at once (nothing is left to abort), and begins a new transaction;
beginning a new one without that abort is accepted too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from onceflow.connector.accumulator import DeliveryCallback
from onceflow.connector.config import ProducerConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.generations import dropped_since
from onceflow.connector.message import Message
from onceflow.connector.store import PartitionKey, RecordFields, Store, Writer, records_of
from onceflow.txn import shared
from onceflow.txn.batched_writer import Position
from onceflow.txn.group import TransactionGroup
from onceflow.txn.staging import StagingWriter
from onceflow.txn.state import TransactionStateMachine, TxnState

Report = tuple[DeliveryCallback, KafkaError | None, Message]
_YIELD_EVERY = 64  # admitted records between releases of the GIL while the BEGIN or its fencing look is pending


class ProducerTransactions:
    """The transactional state of one Producer: its group, fenced writer, open transaction and its offsets."""

    def __init__(self, store: Store, config: ProducerConfig, transactional_id: str,
                 forget_routes: Callable[[Iterable[str]], None]) -> None:
        """``forget_routes``: the Producer routes its next records to these topics' current epochs (a scale sealed
        one of their partitions under a commit)."""
        self._store = store
        self._forget_routes = forget_routes
        self._config = config
        self._id = transactional_id
        self._machine = TransactionStateMachine(transactional_id)
        self._group: TransactionGroup | None = None
        self._writer: Writer | None = None
        # The open transaction's BEGIN, written once it stages records (one that fits in memory commits in one step).
        self._begun: Future[Position] | None = None
        # A look at this producer's fencing, made at begin_transaction while the application produces, where a
        # one-step commit checks fencing by a look (Kafka) that any look made since the log last moved serves: the
        # commit then need not wait for one (a round trip: ~0.5 ms on a local broker, one RTT on a remote cluster).
        # The look is a thread: ``admit`` lets it run (see there).
        self._looks = ThreadPoolExecutor(1, thread_name_prefix=f"txn-fencing-{transactional_id}")
        self._looked: Future[None] | None = None  # that look, done once made
        # A commit without staging (in one step, or inline) whose outcome stayed unknown: its id, for
        # abort_transaction to ask the log about (no BEGIN of this producer's names it: before, the abort found
        # nothing to abort, and an application that then produced the transaction again published it twice if it
        # had committed).
        self._maybe_committed: str | None = None
        self._started = 0.0  # when begin_transaction was called (monotonic)
        self._txn: StagingWriter | None = None  # its writer, made once the BEGIN is stored
        # Records produced before that, by partition, as plain tuples (RecordFields) until they are written.
        self._buffered: dict[PartitionKey, list[RecordFields]] = {}
        self._admitted = 0  # records checked by admit(), for its releases of the GIL
        self._offsets: dict[str, dict[PartitionKey, int]] = {}
        self._members: dict[str, str] = {}  # consumer group -> the member whose input its offsets follow
        # consumer group -> partition -> that member's generation in the oldest metadata sent with its offset
        self._generations: dict[str, dict[PartitionKey, int]] = {}
        self._unstaged: list[Report] = []  # reports of records not staged yet, due when they are or they fail
        self._due: list[Report] = []  # reports due to the application, whatever the call that made them raised
        self._error: KafkaError | None = None  # why the transaction became abortable, or the producer unusable
        self._timed_out: KafkaError | None = None  # the last transaction timed out; abort_transaction() is due

    def init(self) -> None:
        """Fence every older instance of this transactional.id, abort their open transaction, roll forward."""
        self._machine.require(TxnState.UNINITIALIZED, doing="init_transactions")
        group = shared.acquire(self._config.store, self._config.transactions)
        try:
            writer = self._store.open_writer(self._id)
            failpoint("producer.init.after_fence")
            group.fence(self._id, writer.epoch)
            group.merge()
        except BaseException:
            shared.release(group)
            raise
        self._group, self._writer = group, writer
        self._machine.move(TxnState.READY, "init_transactions")

    def begin(self) -> None:
        self._raise_if_failed()
        self._machine.require(TxnState.READY, doing="begin_transaction")
        self._ready()
        self._timed_out = None  # a new transaction after a timed-out one, without the abort: accepted
        # A transaction that fits in memory is begun and committed in one step at commit_transaction: nothing is
        # written yet, and a bigger one writes its BEGIN when it first stages records. Where that step checks
        # fencing by a look (Kafka), the look is made now, while the application produces.
        self._started = time.monotonic()
        group, writer = self._ready()
        if group.looks_for_fencing:
            self._looked = self._looks.submit(_look_for_fencing, writer)
        self._machine.move(TxnState.IN_TRANSACTION, "begin_transaction")

    def admit(self, topic: str) -> bool:
        """Check that a record may join the open transaction (raises what producing outside one raises); returns
        whether the next ones may skip this check (the Producer's accumulator then takes them until the
        transaction's next call), which they may not while its fencing look is pending.

        A tight produce() loop holds the GIL: the thread looking for fencing would get it only after the
        interpreter's switch interval (5 ms), so its round trip would wait for commit_transaction. Until it is
        done, a record comes here, and every so often releases the GIL."""
        if self._machine.state is not TxnState.IN_TRANSACTION:
            self._raise_if_failed()
            self._raise_if_timed_out()
            self._machine.require(TxnState.IN_TRANSACTION, doing=f"produce to {topic!r} outside a transaction")
        if self._looked is None or self._looked.done():
            return True
        self._admitted += 1
        if self._admitted % _YIELD_EVERY == 0:
            time.sleep(0)
        return False

    def add(self, records: dict[PartitionKey, list[RecordFields]], reports: list[Report]) -> None:
        """Add records queued by partition, and the delivery reports due once they are staged, to the open
        transaction (which the Producer's :meth:`admit` let them join)."""
        for tp, fields in records.items():
            buffered = self._buffered.get(tp)
            if buffered is None:
                self._buffered[tp] = fields
            else:
                buffered.extend(fields)
        self._unstaged.extend(reports)

    def take_reports(self) -> list[Report]:
        """The delivery reports due since the last take: of records staged or committed, or failed with their
        transaction (after every call, whatever it raised: a report dropped with an error left its record counted
        in ``len(producer)`` for good)."""
        due, self._due = self._due, []
        return due

    def flush(self) -> None:
        """Stage what is buffered; a failure makes the transaction abortable and fails these records' reports."""
        if self._machine.state is not TxnState.IN_TRANSACTION or not (self._buffered or self._txn):
            return
        reports, self._unstaged = self._unstaged, []
        buffered, self._buffered = self._buffered, {}
        try:
            writer = self._staging_writer()
            for (topic, partition), fields in buffered.items():
                for record in records_of(fields):
                    writer.produce(topic, record, partition)
            writer.flush()
        except BaseException as exc:  # these records are out of the buffer, perhaps partly staged
            error = self.fail_with(exc, "staging records").error
            self._due.extend(_failed(reports, error))
            if not isinstance(exc, KafkaException):
                raise
            return
        self._due.extend(reports)

    def fail_with(self, exc: BaseException, doing: str) -> KafkaException:
        """Fail the open transaction after ``exc`` lost some of its records on the way (an exception that is not
        Kafka's, an interrupt say, as a failure of ``doing``): it must be aborted, as a commit would publish it
        without them. Returns what to raise for it."""
        failure = exc if isinstance(exc, KafkaException) else KafkaException(KafkaError(
            ErrorCode._FAIL, f"transactional.id {self._id!r}: {doing} raised {exc!r}"))
        if self._machine.state is not TxnState.IN_TRANSACTION:
            return failure  # no transaction open to fail (and ``exc`` is raised as it is)
        return self._fail(failure)

    def send_offsets(self, group_id: str, offsets: dict[PartitionKey, int], member_id: str | None = None,
                     generation: int = -1) -> None:
        self._machine.require(TxnState.IN_TRANSACTION, doing="send_offsets_to_transaction")
        if group_id in self._offsets and self._members.get(group_id) != member_id:
            fail(ErrorCode.INVALID_REQUEST, f"transactional.id {self._id!r}: offsets of group {group_id!r} were sent "
                 f"in this transaction with another consumer's metadata ({self._members.get(group_id)!r}, now "
                 f"{member_id!r}); a transaction commits one consumer's offsets per group")
        if offsets:  # none valid: nothing to commit, as librdkafka (no empty group in the COMMIT)
            self._offsets.setdefault(group_id, {}).update(offsets)
            if member_id is not None:
                self._members[group_id] = member_id
            if member_id is not None and generation >= 0:
                sent = self._generations.setdefault(group_id, {})
                sent.update({key: min(generation, sent.get(key, generation)) for key in offsets})

    def commit(self) -> None:
        """Commit the open transaction; its data is visible when this returns."""
        self._raise_if_failed()
        self._raise_if_timed_out()
        self._machine.require(TxnState.IN_TRANSACTION, doing="commit_transaction")
        self._check_generations()
        if self._txn is None and self._commit_in_one_step():  # nothing staged: in one step, if the store can
            return
        self.flush()
        self._raise_if_failed()
        group, txn = self._current()
        self._machine.move(TxnState.COMMITTING, "commit_transaction")
        try:
            # A zombie must not commit, even a transaction without records (it may carry offsets). Checked by a
            # look after its BEGIN is stored (a staging append's serves): a successor that fences us after it
            # aborts this transaction unless our COMMIT is stored first.
            self._ready()[1].check_not_fenced(since=self._begun.result().stored_at if self._begun else None)
            participant = txn.participant()
            group.commit(txn.txn_id, [participant] if participant else [], self._offsets, self._members)
        except KafkaException as exc:
            if not self._committed_after_all(group, txn.txn_id, exc):
                raise self._fail(exc) from None
        self._end_transaction(None)

    def _check_generations(self) -> None:
        """Refuse (abort) the commit if a member of this process gave up any partition whose offset the transaction
        commits after the metadata sent with it was taken (connector/generations.py): ILLEGAL_GENERATION if it got
        the partition back (another member may have processed its records meanwhile), UNKNOWN_MEMBER_ID if it
        does not hold it now (as the stores' own check says, which comes later: a rebalance before it may have
        given the partition back)."""
        for group_id, sent in self._generations.items():
            member_id = self._members[group_id]
            back, gone = dropped_since(group_id, member_id, sent)
            where = f"transactional.id {self._id!r}: member {member_id!r} of group {group_id!r}"
            if back:
                raise self._fail(KafkaException(KafkaError(
                    ErrorCode.ILLEGAL_GENERATION, f"{where} gave {back} up and got them back after the metadata "
                    "sent with their offsets was taken: another member may have processed their records "
                    "meanwhile; abort the transaction")))
            if gone:
                raise self._fail(KafkaException(KafkaError(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"{where} no longer owns {gone} (the group rebalanced and gave them "
                    "to another member); abort the transaction")))

    def _committed_after_all(self, group: TransactionGroup, txn_id: str, exc: KafkaException) -> bool:
        """After a commit error with an unknown outcome, whether the log says the COMMIT took effect: then the
        commit succeeded, and reporting an error would make the application publish the transaction twice."""
        if not exc.error.outcome_unknown():
            return False
        try:
            return group.committed_after_all(txn_id)
        except KafkaException:
            return False  # the log cannot be read either: the error stays "outcome unknown"

    def _commit_in_one_step(self) -> bool:
        """Commit a transaction that never staged records in one atomic step, if the store can (False: it cannot)."""
        group, writer = self._ready()
        if (time.monotonic() - self._started) * 1000 > self._config.transaction_timeout_ms:
            self._timed_out = _abort_required(KafkaError(
                ErrorCode.TRANSACTION_TIMED_OUT, f"transactional.id {self._id!r}: the transaction passed "
                f"transaction.timeout.ms ({self._config.transaction_timeout_ms}) before its commit; it was aborted"))
            self._machine.move(TxnState.ABORTING, "abort_transaction")  # it never wrote anything: nothing to abort
            self._end_transaction(self._timed_out)
            raise KafkaException(self._timed_out)
        self._machine.move(TxnState.COMMITTING, "commit_transaction")
        # The queued field tuples as they are (stores and the merge read records by position): a named tuple made
        # per record cost more than the rest of a small commit's per-record work.
        targets = self._buffered
        if self._looked is not None:
            self._looked.result()  # the look for fencing the commit checks by: one begun already serves (Kafka)
        try:  # the append checks that this writer is not fenced
            committed = group.commit_at_once(targets, writer, owner=self._id, owner_epoch=writer.epoch,
                                             offsets=self._offsets, members=self._members,
                                             timeout_ms=self._config.transaction_timeout_ms,
                                             begun=self._begun,
                                             on_sealed=lambda: self._forget_routes({topic for topic, _ in targets}),
                                             on_unknown=self._note_maybe_committed)
        except KafkaException as exc:
            raise self._fail(exc) from None
        if committed is None:
            self._machine.move(TxnState.IN_TRANSACTION, "stage instead")
            return False
        self._end_transaction(None)
        return True

    def _note_maybe_committed(self, txn_id: str) -> None:
        self._maybe_committed = txn_id

    def abort(self) -> None:
        """Abort the open transaction; records not yet staged get _PURGE_QUEUE reports. After TRANSACTION_TIMED_OUT
        it succeeds at once: the log already aborted that transaction."""
        if self._timed_out is not None and self._machine.state is TxnState.READY:
            self._timed_out = None
            return
        self._machine.require(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, doing="abort_transaction")
        self._machine.move(TxnState.ABORTING, "abort_transaction")
        try:
            # A BEGIN that failed has nothing to abort. A commit whose outcome was unknown may have committed after
            # all (none of its records may be produced again, and their reports are successes): the log says.
            begun = self._begun
            txn_id = begun.result().txn_id if begun is not None and begun.exception() is None else None
            txn_id = txn_id or self._maybe_committed
            group, writer = self._ready()
            committed = txn_id is not None and group.abort_unless_committed(txn_id, self._id, writer.epoch)
        except KafkaException as exc:
            raise self._fail(exc) from None
        if not committed:
            self._end_transaction(KafkaError(ErrorCode._PURGE_QUEUE, "the transaction was aborted"))
            return
        self._end_transaction(None)
        fail(ErrorCode.INVALID_TXN_STATE, f"transactional.id {self._id!r}: cannot abort: transaction {txn_id}, whose "
             "commit's outcome was unknown, committed after all; do not produce it again")

    def close(self) -> None:
        # A look not begun is dropped; one under way is waited for: it uses the store the producer closes next.
        self._looks.shutdown(wait=True, cancel_futures=True)
        writer, group, self._writer, self._group = self._writer, self._group, None, None
        try:
            if writer is not None:  # on Kafka its producers and their threads live until it is closed
                writer.close()
        finally:
            if group is not None:  # the group is shared: released even if closing the writer failed
                shared.release(group)

    def _ready(self) -> tuple[TransactionGroup, Writer]:
        if self._group is None or self._writer is None:
            fail(ErrorCode.INVALID_TXN_STATE, f"transactional.id {self._id!r}: call init_transactions() first")
        return self._group, self._writer

    def _current(self) -> tuple[TransactionGroup, StagingWriter]:
        return self._ready()[0], self._staging_writer()

    def _staging_writer(self) -> StagingWriter:
        """The open transaction's writer (waits for its BEGIN to be stored the first time)."""
        if self._txn is None:
            if self._machine.state not in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
                fail(ErrorCode.INVALID_TXN_STATE, f"transactional.id {self._id!r}: no transaction is open")
            group, writer = self._ready()
            if self._begun is None:
                self._begun = group.begin_async(self._config.transaction_timeout_ms, owner=self._id,
                                                owner_epoch=writer.epoch)
            txn_id = self._begun.result().txn_id
            self._txn = group.writer(txn_id, f"{self._id}#{writer.epoch}", writer, known_open=True)
        return self._txn

    def _raise_if_failed(self) -> None:
        """The fatal error of a fenced producer; or, in an abortable transaction, that it must be aborted."""
        if self._machine.state is TxnState.FATAL_ERROR and self._error is not None:
            raise KafkaException(self._error)
        if self._machine.state is TxnState.ABORTABLE_ERROR:
            raise KafkaException(KafkaError(ErrorCode.INVALID_TXN_STATE, f"transactional.id {self._id!r}: the "
                                            f"transaction failed ({self._error}); abort it", txn_requires_abort=True))

    def _raise_if_timed_out(self) -> None:
        """After TRANSACTION_TIMED_OUT, until abort_transaction() or begin_transaction(): that error again."""
        if self._timed_out is not None and self._machine.state is TxnState.READY:
            raise KafkaException(self._timed_out)

    def _fail(self, exc: KafkaException) -> KafkaException:
        """Move to the state ``exc`` leaves this producer in; returns what to raise (with librdkafka's flags)."""
        self._error = exc.error
        if exc.error.fatal():
            self._machine.move(TxnState.FATAL_ERROR, "fail")
            self._fail_unstaged(exc.error)  # this producer stages nothing more
        elif exc.code == ErrorCode.TRANSACTION_TIMED_OUT:
            self._timed_out = _abort_required(exc.error)
            self._end_transaction(self._timed_out)  # the log says it aborted: nothing left to abort
            return KafkaException(self._timed_out)
        else:
            self._machine.move(TxnState.ABORTABLE_ERROR, "fail")
            if not exc.error.txn_requires_abort():  # flagged as librdkafka flags it: the application aborts on it
                return KafkaException(_abort_required(exc.error))
        return exc

    def _fail_unstaged(self, error: KafkaError) -> None:
        """The records not staged yet will not be: their reports are due, with ``error``."""
        self._due.extend(_failed(self._unstaged, error))
        self._unstaged = []

    def _end_transaction(self, error: KafkaError | None) -> None:
        """The transaction ended: committed (``error`` None: its records' reports are due) or not (they fail)."""
        if error is None:
            self._due.extend(self._unstaged)
            self._unstaged = []
        else:
            self._fail_unstaged(error)
        self._begun, self._looked, self._txn, self._buffered, self._offsets = None, None, None, {}, {}
        self._members, self._generations = {}, {}
        self._maybe_committed = None
        self._machine.move(TxnState.READY, "end the transaction")


def _look_for_fencing(writer: Writer) -> None:
    """Look whether ``writer`` is fenced, for the commit's check to find done; a failure is left to that check,
    which then looks again."""
    try:
        writer.check_not_fenced()
    except KafkaException:
        return  # the commit's check reports it


def _abort_required(error: KafkaError) -> KafkaError:
    """``error`` flagged as librdkafka flags an abortable transaction error: call abort_transaction()."""
    return KafkaError(error.code(), f"{error.str()}; call abort_transaction(), then begin a new transaction",
                      txn_requires_abort=True, outcome_unknown=error.outcome_unknown())


def _failed(reports: list[Report], error: KafkaError) -> list[Report]:
    """``reports`` as failed with ``error`` (their messages carry it too)."""
    for _, _, message in reports:
        message.set_error(error)
    return [(callback, error, message) for callback, _, message in reports]
