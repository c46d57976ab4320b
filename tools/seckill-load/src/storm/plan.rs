//! What a storm does, drawn from its seed before it starts: each buyer's fate, and the
//! faults on a timeline. The same seed and options give the same plan (what happens at
//! run time still depends on timing: which request reaches Redis first, which call a
//! lost answer hits).

use std::path::PathBuf;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The storm's size, pace and faults.
#[derive(Debug, Clone, clap::Args)]
pub struct StormOptions {
    /// The plan's seed (default: a random one, printed)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Buyers of the first wave
    #[arg(long, default_value_t = 600)]
    pub buyers: u32,
    /// Units on sale
    #[arg(long, default_value_t = 200)]
    pub stock: u32,
    /// A second wave of this share of the buyers, buying what came back
    #[arg(long, default_value_t = 0.25)]
    pub second_wave: f64,
    /// Requests in flight at most
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Stock buckets
    #[arg(long, default_value_t = 3)]
    pub buckets: u16,
    /// Seconds a buyer has to pay
    #[arg(long, default_value_t = 15)]
    pub pay_window_s: u64,
    /// Buyers the waiting room lets in per second
    #[arg(long, default_value_t = 100)]
    pub entry_rate: u32,
    /// Faults to inject (default: all; the failover and the slot move need the cluster stack)
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,
    /// No fault at all
    #[arg(long, conflicts_with = "faults")]
    pub no_faults: bool,
    /// Drainer runs killed with SIGKILL during the sale
    #[arg(long, default_value_t = 6)]
    pub drainer_kills: u32,
    /// Soak: storms one after another (the next seed each) for this long; 0: one storm
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// The order-drainer binary (default: beside this one, or its parent folder's)
    #[arg(long)]
    pub drainer_bin: Option<PathBuf>,
    /// No progress bar
    #[arg(long)]
    pub quiet: bool,
}

impl StormOptions {
    /// The faults asked for (all by default, none with `--no-faults`).
    pub fn normalise(mut self) -> StormOptions {
        if self.no_faults {
            self.faults.clear();
        } else if self.faults.is_empty() {
            self.faults = FaultKind::ALL.to_vec();
        }
        self
    }
}

/// What a buyer does once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fate {
    /// Checks out and pays at once; the provider delivers the success three times at once.
    Pay,
    /// The first attempt fails (a declined card), the second, same payment, succeeds.
    FailThenPay,
    /// Pays only after the order's deadline: the money is to be refunded.
    PayLate,
    /// Pays, then a second payment of its own for the same order: that one is refunded.
    PayTwice,
    /// Cancels; with `rebuy` buys again (and pays).
    Cancel { rebuy: bool },
    /// Never pays: the order expires and its unit goes back on sale.
    Expire,
    /// Pays the wrong amount (refused), then the right one.
    WrongAmountThenPay,
}

/// One buyer's part.
#[derive(Debug, Clone, Serialize)]
pub struct BuyerPlan {
    pub user: String,
    /// Second wave: starts once units came back.
    pub second_wave: bool,
    pub fate: Fate,
    /// The buyer's first request of the purchase loses its answer (the client gives up
    /// after sending it) and is sent again.
    pub lose_reply: bool,
}

/// A fault and when it starts, from the sale's start.
#[derive(Debug, Clone, Serialize)]
pub struct FaultAt {
    pub at: Duration,
    pub fault: Fault,
}

#[derive(Debug, Clone, Serialize)]
pub enum Fault {
    /// A drainer run (`order-drainer --once`) killed with SIGKILL after this long.
    KillDrainer { after: Duration },
    /// Every Data API call answered `DatabaseUnavailableException` for this long.
    DatabaseOutage { lasting: Duration },
    /// A share of Data API calls run and lose their answer, for this long.
    LostAnswers { per_mille: u32, lasting: Duration },
    /// A graceful `CLUSTER FAILOVER` of the primary serving a bucket (cluster stack).
    Failover { bucket: u16 },
    /// The slot of a bucket moves to another primary, key by key (cluster stack).
    MoveSlot { bucket: u16 },
}

/// The whole plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub seed: u64,
    pub buyers: Vec<BuyerPlan>,
    pub faults: Vec<FaultAt>,
}

/// Which faults a storm injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
pub enum FaultKind {
    /// SIGKILL of drainer runs at random moments.
    DrainerKill,
    /// A database outage longer than the pay window.
    DbOutage,
    /// Data API answers lost after the call ran; buyers' HTTP answers lost too.
    LostReplies,
    /// A graceful primary failover (cluster stack only).
    Failover,
    /// A bucket's slot moving to another primary (cluster stack only).
    SlotMove,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::DrainerKill,
        FaultKind::DbOutage,
        FaultKind::LostReplies,
        FaultKind::Failover,
        FaultKind::SlotMove,
    ];
}

impl Plan {
    /// The plan of `seed` for `o`; `cluster`: the stack runs several primaries (the
    /// failover and the slot move need them).
    pub fn draw(seed: u64, o: &StormOptions, cluster: bool) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let second = (o.buyers as f64 * o.second_wave) as u32;
        let buyers = (0..o.buyers + second)
            .map(|i| {
                let roll: f64 = rng.random();
                let fate = match roll {
                    r if r < 0.40 => Fate::Pay,
                    r if r < 0.50 => Fate::FailThenPay,
                    r if r < 0.58 => Fate::PayLate,
                    r if r < 0.64 => Fate::PayTwice,
                    r if r < 0.74 => Fate::Cancel {
                        rebuy: rng.random_bool(0.5),
                    },
                    r if r < 0.96 => Fate::Expire,
                    _ => Fate::WrongAmountThenPay,
                };
                let second_wave = i >= o.buyers;
                BuyerPlan {
                    user: format!("storm{seed:x}-{i}"),
                    second_wave,
                    // The second wave pays: it buys what the first let go.
                    fate: if second_wave { Fate::Pay } else { fate },
                    lose_reply: o.faults.contains(&FaultKind::LostReplies) && rng.random_bool(0.05),
                }
            })
            .collect();
        let window = Duration::from_secs(o.pay_window_s);
        // The faults fall within the first wave's time: the sale's first two pay windows.
        let span = window * 2;
        let at = |rng: &mut StdRng| span.mul_f64(rng.random());
        let mut faults = Vec::new();
        for kind in &o.faults {
            match kind {
                FaultKind::DrainerKill => {
                    for _ in 0..o.drainer_kills {
                        let after = Duration::from_millis(rng.random_range(50..2_500));
                        faults.push(FaultAt {
                            at: at(&mut rng),
                            fault: Fault::KillDrainer { after },
                        });
                    }
                }
                FaultKind::DbOutage => faults.push(FaultAt {
                    at: window.mul_f64(rng.random_range(0.2..0.8)),
                    // Longer than the pay window: orders expire while nothing reaches
                    // the database, payments wait, closes pile up.
                    fault: Fault::DatabaseOutage {
                        lasting: window.mul_f64(rng.random_range(1.2..1.6)),
                    },
                }),
                FaultKind::LostReplies => faults.push(FaultAt {
                    at: at(&mut rng),
                    fault: Fault::LostAnswers {
                        per_mille: rng.random_range(20..80),
                        lasting: window,
                    },
                }),
                FaultKind::Failover if cluster => faults.push(FaultAt {
                    at: at(&mut rng),
                    fault: Fault::Failover {
                        bucket: rng.random_range(0..o.buckets),
                    },
                }),
                FaultKind::SlotMove if cluster => faults.push(FaultAt {
                    at: at(&mut rng),
                    fault: Fault::MoveSlot {
                        bucket: rng.random_range(0..o.buckets),
                    },
                }),
                FaultKind::Failover | FaultKind::SlotMove => {}
            }
        }
        faults.sort_by_key(|f| f.at);
        Plan {
            seed,
            buyers,
            faults,
        }
    }
}
