//! The machine a run measured on and how busy it was (read from /proc), as the report
//! describes it.

use std::fmt::Write as _;

use seckill_shared::domain::{format_rfc3339_millis, now_millis};
use serde::{Deserialize, Serialize};

/// The machine and how busy it was.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    pub at: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_gib: f64,
    pub mem_available_gib: f64,
    pub loadavg: [f64; 3],
    /// Compiler and linker processes running (other builds share the CPUs).
    pub builders: usize,
    pub kernel: String,
    pub redis_version: Option<String>,
    pub mariadb_version: Option<String>,
}

impl Machine {
    /// Reads /proc (Linux).
    pub fn read() -> Machine {
        let proc = |f: &str| std::fs::read_to_string(format!("/proc/{f}")).unwrap_or_default();
        let cpuinfo = proc("cpuinfo");
        let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name"));
        let model = model.and_then(|l| Some(l.split_once(':')?.1.trim()));
        let meminfo = proc("meminfo");
        let gib = |key: &str| -> f64 {
            let kib = meminfo.lines().find_map(|l| l.strip_prefix(key));
            let kib = kib.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
            kib.unwrap_or(0.0) / 1048576.0
        };
        let loadavg = proc("loadavg");
        let mut load = loadavg.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
        Machine {
            at: format_rfc3339_millis(now_millis()),
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: model.unwrap_or("unknown").to_string(),
            mem_total_gib: gib("MemTotal:"),
            mem_available_gib: gib("MemAvailable:"),
            loadavg: std::array::from_fn(|_| load.next().unwrap_or(0.0)),
            builders: count_builders(),
            kernel: proc("sys/kernel/osrelease").trim().to_string(),
            redis_version: None,
            mariadb_version: None,
        }
    }

    pub fn describe(&self) -> String {
        let (m, [l1, l5, l15]) = (self, self.loadavg);
        let mut s = format!(
            "{} × {}, {:.1} GiB RAM ({:.1} GiB available), Linux {}, load average {l1:.2} / {l5:.2} / {l15:.2}, {} compiler/linker processes running",
            m.nproc, m.cpu_model, m.mem_total_gib, m.mem_available_gib, m.kernel, m.builders
        );
        for (name, v) in [("Redis", &m.redis_version), ("MariaDB", &m.mariadb_version)] {
            if let Some(v) = v {
                let _ = write!(s, ", {name} {v}");
            }
        }
        s
    }
}

/// Processes named like compilers or linkers (rustc, cc1, ld, ...).
fn count_builders() -> usize {
    let names = [
        "rustc", "cc1", "cc1plus", "ld", "ld.lld", "collect2", "cc", "clang",
    ];
    // Every process's directory (and self, which is no builder).
    let dir = std::fs::read_dir("/proc").into_iter().flatten();
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|c| names.contains(&c.trim()))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_described() {
        let m = Machine::read();
        assert!(m.nproc >= 1);
        assert!(m.describe().contains("load average"));
    }
}
