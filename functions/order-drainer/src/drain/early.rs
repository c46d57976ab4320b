//! Writing while the survey still probes: the reads its probes made are handed over as
//! they come back and written at once ([`Early`]), so that with thousands of small
//! sales the database commits groups while Redis answers the rest of the probes,
//! instead of the two working one after the other.
//!
//! Only the plain case is handed over (the survey decides, [`Drainer::survey`]): a
//! voucher of one bucket, with nothing to claim (recovery goes first: the probe reads
//! nothing then anyway) and no payment close to settle (the sweep after the survey does
//! that). Everything else waits for the first round, as before.
//!
//! Invariants kept here:
//! - the writes are [`Drainer::drain_round`]'s own (a group of small sales per
//!   transaction, a large read batch after batch), so every guarantee of a round holds:
//!   each entry ends acked after its commit, or pending;
//! - at most `DRAINER_CONCURRENCY` writes at once, as in a round;
//! - every write started is awaited ([`Early::finish`]), even when the survey's time ran
//!   out: a transaction is never dropped half way.

use std::collections::{BTreeMap, VecDeque};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use seckill_shared::domain::{Bucket, StreamEntry};

use super::group::{Filling, is_small};
use super::run::Run;
use super::{Drainer, Read};

/// The survey's reads being written while it goes on: small reads gathered into a
/// group until it is full (as a round gathers them, [`Filling`]), a large read started
/// at once.
pub(super) struct Early<'a> {
    drainer: &'a Drainer,
    run: &'a Run,
    /// Small reads gathered for the next group.
    filling: Filling,
    /// Work waiting for a free slot: large reads first, then the groups in the order
    /// they filled.
    ready: VecDeque<Vec<Read>>,
    in_flight: FuturesUnordered<BoxFuture<'a, BTreeMap<Bucket, usize>>>,
    /// How many entries each voucher written so far had read.
    had: BTreeMap<Bucket, usize>,
}

impl Drainer {
    /// The writer of one survey's reads (a method, so that the survey names nothing of
    /// this module: it uses the survey's items, not the other way round).
    pub(super) fn early_writes<'a>(&'a self, run: &'a Run) -> Early<'a> {
        Early::new(self, run)
    }
}

impl<'a> Early<'a> {
    fn new(drainer: &'a Drainer, run: &'a Run) -> Early<'a> {
        Early {
            drainer,
            run,
            filling: Filling::default(),
            ready: VecDeque::new(),
            in_flight: FuturesUnordered::new(),
            had: BTreeMap::new(),
        }
    }

    /// Takes one probe's read of a plain voucher (see the module header).
    pub(super) fn push(&mut self, bucket: Bucket, entries: Vec<StreamEntry>) {
        let batch = self.drainer.cfg.batch_size;
        if !is_small(entries.len(), batch) {
            // Ahead of the groups waiting: a hot sale before the small ones, as a round
            // orders them.
            self.ready.push_front(vec![(bucket, entries)]);
        } else if let Some(group) = self.filling.add((bucket, entries), batch) {
            self.ready.push_back(group);
        }
        self.start();
    }

    fn start(&mut self) {
        while self.in_flight.len() < self.drainer.cfg.concurrency.max(1) {
            let Some(reads) = self.ready.pop_front() else {
                return;
            };
            let (drainer, run) = (self.drainer, self.run);
            self.in_flight
                .push(Box::pin(drainer.drain_round(run, Vec::new(), reads)));
        }
    }

    /// Waits until one write ends and starts the next waiting; never ends while none
    /// runs (for `select!` beside the probes).
    pub(super) async fn progress(&mut self) {
        match self.in_flight.next().await {
            Some(had) => {
                self.had.extend(had);
                self.start();
            }
            None => std::future::pending().await,
        }
    }

    /// Waits for every write started or waiting, and returns how many entries each
    /// voucher written had read, and the small reads gathered but not written yet (the
    /// first round's, with the reads the survey did not hand over).
    pub(super) async fn finish(mut self) -> (BTreeMap<Bucket, usize>, Vec<Read>) {
        self.start();
        while let Some(had) = self.in_flight.next().await {
            self.had.extend(had);
            self.start();
        }
        (self.had, self.filling.into_reads())
    }
}
