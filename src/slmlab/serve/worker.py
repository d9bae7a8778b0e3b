"""The model worker: one thread owns the model and serves every request, batched or one at a time.

Requests wait in a bounded queue (:meth:`Worker.submit` refuses with 503 and ``Retry-After`` when
it is full). The worker thread then either

* **batches** (:meth:`Worker._run_batched`): between two decoding steps it prefills the waiting
  requests (up to ``max_batch`` rows) and joins them to the running :class:`DecodeBatch`; each
  step feeds every row's last token through the model and its cache, samples one token per row
  with that row's own settings and random generator, and removes rows that finished or whose
  client went away. A request that arrives at an idle worker with nobody behind it decodes
  *alone* first, through its own :class:`~slmlab.generation.Decoder` (the family's decode plan:
  one row needs no padding mask, and the plan's step is the cheaper one); as soon as another
  request waits, it hands over: its prompt and the tokens it has so far are prefilled as a row of
  the batch, which goes on from its last token (one prefill, no token lost or repeated); or
* **queues** (:meth:`Worker._run_sequential`): one request at a time, each through its own
  :class:`~slmlab.generation.Decoder` (the family's decode plan when it has one).

Every path steps the same decoder and decides between two steps whether to go on (a finished,
cancelled or handed-over request simply takes no further step).

Either way a request's events (text deltas, the end with its finish reason and token counts, or an
error) go back to the event loop in one hand-over per decoding step (one wake-up of the loop, not
one per row); the worker never blocks on a client.

Every request the worker takes from the queue gets an answer: what fails while one request is
prepared, sampled or detokenized fails that request alone; what fails in a prefill fails the
requests prefilled together; what fails in a decoding step fails the rows of that step; and if
the worker itself breaks, every request it holds or that waits gets a 500 and later ones a 503.
:meth:`Worker.shutdown` (the server's SIGINT/SIGTERM) answers everything held or waiting with a
503 and ends the thread at its next step.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..generation import Decoder, SamplingConfig, sample_next
from ..generation.text import TextStream
from ..layers.fused import frozen_weights
from .batch import CannotBatch, DecodeBatch
from .errors import APIError

logger = logging.getLogger("slmlab.serve")

RETRY_AFTER_S = 1


@dataclass
class Event:
    """What the worker tells a request: ``kind`` is ``"delta"`` (``text``), ``"done"`` (``finish_reason``,
    ``completion_tokens``) or ``"error"`` (``error``)."""

    kind: str
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: APIError | None = None


@dataclass
class Job:
    """One request inside the worker.

    Args:
        prompt_ids: the prompt's token ids.
        max_tokens: the most new tokens.
        sampling: temperature / top-k / top-p (temperature 0: greedy).
        seed: seeds the request's own random generator.
        text: the request's :class:`TextStream` (detokenization and stop strings).
        deliver: takes each :class:`Event`, called on the thread of ``loop``.
        loop: the request's event loop (the worker hands events to it once per decoding step).
    """

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    seed: int
    text: TextStream
    deliver: Callable[[Event], None]
    loop: asyncio.AbstractEventLoop
    cancelled: bool = False
    finished: bool = False
    tokens: int = 0
    generated: list[int] = field(default_factory=list, repr=False)
    generator: torch.Generator | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """The client went away: the worker drops the request at its next step."""
        self.cancelled = True


@dataclass
class _Rows:
    """The batched worker's state: the decoding batch, its jobs (one per row, in order), and a group
    of prefilled jobs whose cache could not join (they start the next batch)."""

    batch: DecodeBatch | None = None
    jobs: list[Job] = field(default_factory=list)
    held: tuple[list[Job], DecodeBatch] | None = None


class Worker:
    """The single model worker.

    Args:
        model: an slmlab causal LM in eval mode.
        stop_ids: end-of-text token ids (a row stops after producing one).
        max_batch: rows decoded together (1 = one request at a time).
        max_queue: requests that may wait for a row; more get 503.
        batched: continuous batching (True) or a queue served one request at a time (False).
        alone_first: batched, a request that finds the worker idle and nobody waiting decodes
            alone through its own decoder until another request arrives (False: every request takes a
            row of the batch from its start).
    """

    def __init__(self, model, stop_ids: list[int], max_batch: int, max_queue: int, batched: bool,
                 alone_first: bool = True) -> None:
        self.model = model
        self.alone_first = alone_first
        self.device = model.device
        self.stop_ids = sorted(set(stop_ids))
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.batched = batched
        self.waiting: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.running = 0
        self.counts = collections.Counter()
        self._stopping = False
        self.broken: str | None = None  # why the worker thread stopped, when it broke
        self._outbox: list[tuple[Job, Event]] = []
        self._held: dict[int, Job] = {}  # what the worker thread took from the queue and has not finished
        self._thread = threading.Thread(target=self._run, name="slmlab-serve-worker", daemon=True)

    # -- the event-loop side ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        """Stop taking requests; the thread answers every held or waiting one with 503 and ends at its
        next step. Returns at once (safe in a signal handler: it only sets a flag and notifies)."""
        self._stopping = True
        with self.cond:
            self.cond.notify_all()

    def stop(self) -> None:
        """:meth:`shutdown` and wait (a while) for the thread."""
        self.shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        """Queue ``job``; 503 with ``Retry-After`` when ``max_queue`` requests already wait, or when the
        server is shutting down or its worker broke."""
        with self.cond:
            if self._stopping:
                raise _shutting_down()
            if self.broken is not None:
                raise APIError(503, "the model worker stopped after an internal error; see the server log and"
                               " restart the server", code="worker_stopped")
            if len(self.waiting) >= self.max_queue:
                self.counts["rejected"] += 1
                raise APIError(503, f"the server is busy: {len(self.waiting)} requests are waiting (--max-queue"
                               f" {self.max_queue}); retry after {RETRY_AFTER_S} s", code="server_overloaded",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
            self.waiting.append(job)
            self.cond.notify()

    def stats(self) -> dict:
        with self.cond:
            return {"running": self.running, "waiting": len(self.waiting), **{k: self.counts[k] for k in
                    ("completed", "cancelled", "failed", "rejected", "tokens", "peak_running")}}

    # -- the worker thread -----------------------------------------------------------------------
    def _next_job(self, block: bool) -> Job | None:
        """The next waiting request that is still wanted (None: nothing waits, or stopping)."""
        with self.cond:
            while True:
                if self._stopping:
                    return None
                while self.waiting:
                    job = self.waiting.popleft()
                    if not job.cancelled:
                        self._held[id(job)] = job
                        return job
                    job.finished = True
                    self.counts["cancelled"] += 1
                if not block:
                    return None
                self.cond.wait()

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            with frozen_weights():  # served weights never change: fused projections are concatenated once
                (self._run_batched if self.batched else self._run_sequential)()
        except BaseException as err:  # a bug in the worker itself: log it, fail what it holds and what waits
            logger.exception("the model worker stopped")
            with self.cond:
                self.broken = f"{type(err).__name__}: {err}"
            self._answer_all(APIError(500, "the model worker stopped after an internal error; see the server log"))
        else:  # shutdown
            self._answer_all(_shutting_down())

    def _answer_all(self, error: APIError) -> None:
        """Fail every request the thread holds or that waits (the thread is about to end)."""
        with self.cond:
            jobs, self.waiting = list(self._held.values()) + list(self.waiting), collections.deque()
            self._held = {}
            self.running = 0
        seen = set()
        for job in jobs:
            if id(job) in seen or job.finished:
                continue
            seen.add(id(job))
            job.finished = True
            self._emit(job, Event("error", error=error))
        self._flush()

    def _emit(self, job: Job, event: Event) -> None:
        self._outbox.append((job, event))

    def _flush(self) -> None:
        """Hand the events of this step to their event loops, one call per loop."""
        by_loop: dict = {}
        for job, event in self._outbox:
            by_loop.setdefault(job.loop, []).append((job, event))
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: the server is shutting down
                pass

    def _prepare(self, job: Job) -> None:
        job.generator = torch.Generator(device=self.device).manual_seed(job.seed)

    def _prepared(self, job: Job) -> bool:
        """Prepare ``job``; on failure fail it alone (False)."""
        try:
            self._prepare(job)
            return True
        except Exception as err:
            self._fail(job, err)
            return False

    def _push(self, job: Job, token: int) -> None:
        """:meth:`_token`, failing ``job`` alone when its text cannot be produced."""
        if job.finished:
            return
        try:
            self._token(job, token)
        except Exception as err:
            self._fail(job, err)

    def _token(self, job: Job, token: int) -> bool:
        """Record one generated token of ``job``; True when the job has finished."""
        job.tokens += 1
        with self.cond:
            self.counts["tokens"] += 1
        delta = job.text.push(token)
        if delta:
            self._emit(job, Event("delta", text=delta))
        reason = None
        if job.text.stopped or token in self.stop_ids:
            reason = "stop"
        elif job.tokens >= job.max_tokens:
            reason = "length"
        if reason is not None:
            self._finish(job, reason)
        return reason is not None

    def _finish(self, job: Job, reason: str) -> None:
        job.finished = True
        self._held.pop(id(job), None)
        rest = job.text.flush()
        if rest:
            self._emit(job, Event("delta", text=rest))
        self._emit(job, Event("done", finish_reason=reason, completion_tokens=job.tokens))
        with self.cond:
            self.counts["completed"] += 1

    def _fail(self, job: Job, err: Exception) -> None:
        if job.finished:
            return
        job.finished = True
        self._held.pop(id(job), None)
        logger.error("request failed", exc_info=err)
        self._emit(job, Event("error", error=APIError(500, f"generation failed: {type(err).__name__}: {err}")))
        with self.cond:
            self.counts["failed"] += 1

    def _drop_cancelled(self, job: Job) -> None:
        job.finished = True
        self._held.pop(id(job), None)
        with self.cond:
            self.counts["cancelled"] += 1

    def _run_sequential(self) -> None:
        while True:
            job = self._next_job(block=True)
            if job is None:
                return
            self._decode_alone(job, hand_over=False)

    def _decode_alone(self, job: Job, hand_over: bool) -> bool:
        """Decode ``job`` by itself through its own :class:`Decoder` to its end; with ``hand_over``,
        stop as soon as another request waits. True when it stopped for that (``job.generated`` holds
        its tokens so far, the last one not yet fed to the model)."""
        with self.cond:
            self.running = 1
            self.counts["peak_running"] = max(self.counts["peak_running"], 1)
        try:  # everything about this request, its preparation included, fails this request alone
            self._prepare(job)
            decoder = Decoder(self.model, job.sampling, generator=job.generator, stop_tokens=self.stop_ids)
            decoder.prefill(torch.tensor([job.prompt_ids], device=self.device), max_new_tokens=job.max_tokens)
            while not (decoder.done or job.finished or job.cancelled or self._stopping):
                token = int(decoder.step()[0])
                job.generated.append(token)
                self._token(job, token)
                self._flush()
                if hand_over and not job.finished and self.waiting:  # a read of the deque's length: a hint
                    return True
        except Exception as err:
            self._fail(job, err)
        if job.cancelled and not job.finished:
            self._drop_cancelled(job)
        elif not job.finished and not self._stopping:  # the decoder ended without a reason we know of
            self._finish(job, "length")
        self._flush()
        with self.cond:
            self.running = 0
        return False

    def _join_handed_over(self, rows: _Rows, job: Job) -> None:
        """Continue a request that decoded alone as the first row of the (empty) batch: prefill its
        prompt and its tokens but the last, which the row feeds next."""
        try:
            row = DecodeBatch(self.model).prefill([job.prompt_ids + job.generated[:-1]],
                                                  next_tokens=torch.tensor(job.generated[-1:], device=self.device))
            rows.batch.join(row)
            rows.jobs.append(job)
        except Exception as err:
            self._fail(job, err)
            self._flush()

    def _sample(self, logits: torch.Tensor, jobs: list[Job]) -> torch.Tensor:
        """One token per row (``[B]``), each with its own sampling settings and generator; a row whose
        sampling fails is failed alone (its token is then the greedy one, and the row leaves at the
        next step)."""
        tokens = logits.argmax(-1)
        for i, job in enumerate(jobs):
            if job.sampling.temperature > 0 and not job.finished:
                try:
                    tokens[i] = sample_next(logits[i : i + 1], job.sampling, job.generator)[0]
                except Exception as err:
                    self._fail(job, err)
        return tokens

    def _reset(self, rows: _Rows) -> None:
        """An empty batch whose rows are ``rows.jobs``, each sampled with its own settings."""
        rows.jobs = []
        rows.batch = DecodeBatch(self.model, lambda logits: self._sample(logits, rows.jobs))

    def _admit(self, free: int, block: bool) -> list[Job]:
        """Up to ``free`` waiting requests (blocking for the first when ``block``)."""
        jobs: list[Job] = []
        while len(jobs) < free:
            job = self._next_job(block=block and not jobs)
            if job is None:
                break
            jobs.append(job)
        return jobs

    # A prefill group pads its prompts to the longest. One forward costs a fixed overhead (a few ms on a
    # CPU) plus its tokens, so short prompts share one: the padding may reach a quarter of the real
    # tokens plus 16 per prompt, and the group at most 8192 tokens.
    PREFILL_PADDING = 0.25
    PREFILL_PADDING_PER_PROMPT = 16
    PREFILL_TOKENS = 8192

    def _prefill_groups(self, jobs: list[Job]) -> list[list[Job]]:
        """``jobs`` by prompt length into groups that are prefilled together with little padding."""
        groups: list[list[Job]] = []
        for job in sorted(jobs, key=lambda j: len(j.prompt_ids)):
            group = groups[-1] if groups else None
            n = len(job.prompt_ids)
            if group is not None:
                real = sum(len(j.prompt_ids) for j in group) + n
                padded = n * (len(group) + 1)  # sorted: the newcomer is the longest
                allowed = self.PREFILL_PADDING * real + self.PREFILL_PADDING_PER_PROMPT * (len(group) + 1)
                if padded - real <= allowed and padded <= self.PREFILL_TOKENS:
                    group.append(job)
                    continue
            groups.append([job])
        return groups

    def _run_batched(self) -> None:
        rows = _Rows()
        self._reset(rows)
        while not self._stopping:
            try:
                self._batched_iteration(rows)
            except Exception as err:  # a bug, not a bad request: fail what the worker holds, keep serving
                logger.exception("a decoding step failed")
                for job in list(self._held.values()):
                    self._fail(job, err)
                self._flush()
                rows = _Rows()
                self._reset(rows)

    def _batched_iteration(self, rows: _Rows) -> None:
        """Admit and prefill waiting requests, drop finished rows, decode one step."""
        if rows.held is not None and not rows.jobs:  # they start the next batch once the current rows are done
            group, prefilled = rows.held
            rows.held = None
            rows.batch.join(prefilled)
            rows.jobs.extend(group)
        admitted = self._admit(self.max_batch - len(rows.jobs), block=not rows.jobs) if rows.held is None else []
        if self.alone_first and len(admitted) == 1 and not rows.jobs and rows.held is None and not self.waiting:
            if self._decode_alone(admitted[0], hand_over=True):
                self._join_handed_over(rows, admitted[0])
            return
        for group in self._prefill_groups(admitted):
            if rows.held is not None:  # an earlier group could not join: the rest waits for the drain too
                with self.cond:
                    for job in group:
                        self._held.pop(id(job), None)
                    self.waiting.extendleft(reversed(group))
                continue
            self._admit_group(rows, group)
        keep = []
        for i, job in enumerate(rows.jobs):
            if job.cancelled and not job.finished:
                self._drop_cancelled(job)
            if not job.finished:
                keep.append(i)
        if len(keep) != len(rows.jobs):
            rows.batch.keep(keep)
            rows.jobs = [rows.jobs[i] for i in keep]
        with self.cond:
            self.running = len(rows.jobs)
            self.counts["peak_running"] = max(self.counts["peak_running"], len(rows.jobs))
        if not rows.jobs:
            return
        try:
            tokens = rows.batch.step().tolist()
        except Exception as err:
            for job in rows.jobs:
                self._fail(job, err)
            self._flush()
            self._reset(rows)
            return
        for job, token in zip(rows.jobs, tokens):
            self._push(job, token)
        self._flush()

    def _admit_group(self, rows: _Rows, group: list[Job]) -> None:
        """Prepare, prefill and join one group of admitted requests. A request that cannot be prepared
        fails alone; a failing prefill or join fails this group only; the running rows go on."""
        group = [job for job in group if self._prepared(job)]
        if not group:
            self._flush()
            return
        try:
            prefilled = DecodeBatch(self.model, lambda logits: self._sample(logits, group))
            first = prefilled.prefill([job.prompt_ids for job in group]).step().tolist()
        except Exception as err:
            for job in group:
                self._fail(job, err)
            self._flush()
            return
        for job, token in zip(group, first):
            self._push(job, token)
        self._flush()  # first tokens out before anything else runs
        try:
            rows.batch.join(prefilled)
            rows.jobs.extend(group)
        except CannotBatch as err:
            logger.info("%d requests wait for the running batch to finish: %s", len(group), err)
            rows.held = (group, prefilled)
        except Exception as err:  # the running batch is unchanged (join restores it)
            for job in group:
                self._fail(job, err)
            self._flush()


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry against a running server", code="server_shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def _deliver(items: list[tuple[Job, Event]]) -> None:
    for job, event in items:
        try:
            job.deliver(event)
        except Exception:  # one request's queue must not keep the others' events from them
            logger.exception("could not deliver an event")
