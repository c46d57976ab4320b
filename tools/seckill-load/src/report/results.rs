//! The JSON document of a run: every benchmark's results, the machine before and after,
//! and what they add up to (every run, every invariant check, the failed baselines, the
//! exit status).

use serde::{Deserialize, Serialize};

use super::machine::Machine;
use crate::admission::{AdmitReport, SaleReport};
use crate::drain::{CommitLatencyReport, DrainReport};
use crate::footprint::FootprintReport;
use crate::record::{Check, RunResult};

/// Everything one invocation of the tool measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    pub tool: String,
    pub command: String,
    pub started_at: String,
    pub finished_at: String,
    pub machine_before: Machine,
    pub machine_after: Option<Machine>,
    pub sale: Option<SaleReport>,
    pub admit: Option<AdmitReport>,
    pub drain: Option<DrainReport>,
    pub commit_latency: Option<CommitLatencyReport>,
    pub footprint: Option<FootprintReport>,
    /// One hot voucher over stock buckets.
    #[serde(default)]
    pub buckets: Option<crate::buckets::BucketsReport>,
}

impl Results {
    /// Every admission run (sale, admit, the paced admissions of commit-latency), in the
    /// order the details table lists them.
    pub fn runs(&self) -> Vec<&RunResult> {
        let (sale, admit) = (self.sale.as_ref(), self.admit.as_ref());
        let runs = [
            sale.map(|s| &s.ours),
            sale.and_then(|s| s.tutorial.as_ref()),
            admit.map(|a| &a.ours),
            admit.and_then(|a| a.ours_adapter.as_ref()),
            admit.and_then(|a| a.tutorial.as_ref()),
            admit.and_then(|a| a.floor.as_ref()),
            admit.and_then(|a| a.ours_durable.as_ref()),
            self.commit_latency.as_ref().map(|l| &l.admissions),
        ];
        let mut runs: Vec<&RunResult> = runs.into_iter().flatten().collect();
        if let Some(b) = &self.buckets {
            runs.extend(b.runs.iter().map(|r| &r.run));
            runs.extend(b.sale.as_ref());
        }
        runs
    }

    /// Every invariant check of every run, with the run it belongs to.
    pub fn checks(&self) -> Vec<(String, Check)> {
        let mut out: Vec<(String, Check)> = Vec::new();
        let mut add = |run: String, checks: &[Check]| {
            out.extend(checks.iter().map(|c| (run.clone(), c.clone())));
        };
        for r in self.runs() {
            add(format!("{} {}", r.scenario, r.variant), &r.checks);
        }
        for r in self.drain.iter().flat_map(|d| d.runs()) {
            let run = format!("drain {} (batch {})", r.variant, r.batch_size);
            add(run, &r.checks);
        }
        if let Some(l) = &self.commit_latency {
            add("commit-latency".into(), &l.checks);
        }
        out
    }

    /// The baselines that FAILED on this server, with the server's error.
    pub fn failed(&self) -> Vec<(String, String)> {
        let (s, a, d) = (self.sale.as_ref(), self.admit.as_ref(), self.drain.as_ref());
        let errors = [
            s.and_then(|s| s.tutorial.as_ref()?.error.as_ref()),
            a.and_then(|a| a.tutorial.as_ref()?.error.as_ref()),
            d.and_then(|d| d.tutorial.as_ref()?.error.as_ref()),
        ];
        let runs = ["sale", "admit", "drain"].into_iter().zip(errors);
        runs.filter_map(|(run, e)| Some((format!("{run} tutorial"), e?.clone())))
            .collect()
    }

    /// The process's exit status: 2 when an invariant was violated, else 3 when a
    /// baseline FAILED on this server, else 0.
    pub fn exit_status(&self) -> u8 {
        match self.checks().iter().any(|(_, c)| !c.ok) {
            true => 2,
            false if !self.failed().is_empty() => 3,
            false => 0,
        }
    }
}
