//! The database on a core of its own, as production has it on another machine: the
//! local stack's MariaDB pinned to CPU 0 and everything else of the stack (Redis, the
//! Data API server, `cargo lambda watch`) and this process to CPU 1, with `taskset`
//! (util-linux) on every thread. Dropping the [`Pinned`] restores every process's own
//! affinity as it was.
//!
//! The stack's processes are found by the pid files `scripts/stack.sh` keeps beside
//! `.dev/stack.env` (`.dev/pids/*.pid`); a pid that is gone is skipped. The same pid
//! tells how much CPU the database spent during a run ([`database_cpu`]), and the
//! other CPU's busy time ([`rest_cpu`]) how much everything else did: together they say
//! whether the database, the work on the way to it, or the waits between the two limit
//! the drain.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

/// The CPU the database gets, and the one everything else shares.
const DB_CPU: usize = 0;
const REST_CPU: usize = 1;

/// Processes pinned, each with the affinity mask it had (restored on drop).
pub struct Pinned {
    restore: Vec<(u32, String)>,
    /// What was pinned where, for the report.
    pub description: String,
}

/// The pid directory of the stack: beside `$SECKILL_STACK_ENV`, else the nearest
/// `.dev/pids` above the working directory.
fn pid_dir() -> Option<PathBuf> {
    if let Some(env) = std::env::var_os("SECKILL_STACK_ENV") {
        let dir = Path::new(&env).parent()?.join("pids");
        return dir.is_dir().then_some(dir);
    }
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|d| d.join(".dev/pids"))
        .find(|d| d.is_dir())
}

/// `name` -> pid of every live process with a pid file.
fn stack_pids(dir: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".pid"))
        else {
            continue;
        };
        let pid = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        if let Some(pid) = pid.filter(|p| Path::new(&format!("/proc/{p}")).exists()) {
            out.push((name.to_string(), pid));
        }
    }
    out.sort();
    out
}

/// The stack's MariaDB's pid, from its pid file.
fn database_pid(pids: &[(String, u32)]) -> Option<u32> {
    pids.iter()
        .find(|(n, _)| n == "mysql" || n == "mariadb")
        .map(|(_, p)| *p)
}

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux build
/// this runs on: the kernel fixes it for user space whatever its own tick rate).
const USER_HZ: f64 = 100.0;

/// The CPU time the stack's MariaDB has spent so far, every thread's (user + system,
/// from `/proc/<pid>/stat`, 10 ms steps); `None` without a local stack's MariaDB. Read
/// at a run's start and end, the difference is the database's share of the run
/// (including its background work, such as purging the rows an earlier run deleted).
pub fn database_cpu() -> Option<f64> {
    let pid = database_pid(&stack_pids(&pid_dir()?))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are numbers.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // utime and stime are fields 14 and 15 of the line: indexes 11 and 12 after the name.
    Some((ticks(11)? + ticks(12)?) as f64 / USER_HZ)
}

/// The time CPU 1 (where [`pin_database`] puts everything but the database) has spent
/// busy so far, in seconds (user, nice, system, irq, softirq and steal of its
/// `/proc/stat` line, 10 ms steps); `None` where there is no such line. Read at a
/// pinned run's start and end, the difference is the work of Redis, the drainer and the
/// Data API server (and of anything else the machine ran there meanwhile).
pub fn rest_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let label = format!("cpu{REST_CPU}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))?;
    busy_ticks(line).map(|t| t as f64 / USER_HZ)
}

/// The busy ticks of one `cpuN` line of `/proc/stat`: every field but idle and iowait
/// (guest time is already counted in user).
fn busy_ticks(line: &str) -> Option<u64> {
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    (f.len() >= 4).then(|| at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

/// A process's affinity mask as `taskset -p` prints it (hex).
fn mask_of(pid: u32) -> anyhow::Result<String> {
    let out = Command::new("taskset")
        .arg("-p")
        .arg(pid.to_string())
        .output()
        .context("running taskset (util-linux)")?;
    anyhow::ensure!(out.status.success(), "taskset -p {pid} failed");
    let text = String::from_utf8_lossy(&out.stdout);
    text.rsplit(':')
        .next()
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .context("taskset printed no mask")
}

/// Sets every thread of `pid` to `cpus` (`taskset -a -p -c`); with `mask`, to a mask.
fn set(pid: u32, cpus: Option<usize>, mask: Option<&str>) -> anyhow::Result<()> {
    let mut cmd = Command::new("taskset");
    cmd.arg("-a").arg("-p");
    match (cpus, mask) {
        (Some(c), _) => cmd.arg("-c").arg(c.to_string()),
        (None, Some(m)) => cmd.arg(m),
        (None, None) => anyhow::bail!("nothing to set"),
    };
    let out = cmd
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .output()
        .context("running taskset")?;
    anyhow::ensure!(
        out.status.success(),
        "taskset on {pid}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Pins the stack's MariaDB to its own CPU and the rest (this process included) to
/// another. An error, with nothing left pinned, when the machine has one CPU, the stack
/// has no MariaDB pid file, or `taskset` is missing.
pub fn pin_database() -> anyhow::Result<Pinned> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    anyhow::ensure!(cpus >= 2, "one CPU: nothing to pin apart");
    let dir = pid_dir().context("no .dev/pids of a local stack found")?;
    let pids = stack_pids(&dir);
    let db =
        database_pid(&pids).context("the stack has no running MariaDB (pid file mysql.pid)")?;
    let mut pinned = Pinned {
        restore: Vec::new(),
        description: String::new(),
    };
    let me = std::process::id();
    let mut rest: Vec<(String, u32)> = pids.into_iter().filter(|(_, p)| *p != db).collect();
    rest.push(("seckill-load".into(), me));
    pinned.restore.push((db, mask_of(db)?));
    set(db, Some(DB_CPU), None)?;
    let mut names = Vec::new();
    for (name, pid) in rest {
        let Ok(mask) = mask_of(pid) else { continue };
        pinned.restore.push((pid, mask));
        set(pid, Some(REST_CPU), None)?;
        names.push(name);
    }
    pinned.description = format!(
        "MariaDB (pid {db}) on CPU {DB_CPU}; {} on CPU {REST_CPU} (taskset, every thread)",
        names.join(", ")
    );
    Ok(pinned)
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for (pid, mask) in &self.restore {
            if let Err(e) = set(*pid, None, Some(mask)) {
                eprintln!("could not restore the affinity of {pid}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_line_is_busy_for_all_but_idle_and_iowait() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let line = "cpu1 100 2 30 5000 40 1 6 7 9 0";
        assert_eq!(busy_ticks(line), Some(100 + 2 + 30 + 1 + 6 + 7));
        assert_eq!(busy_ticks("cpu1 1 2"), None);
        assert_eq!(busy_ticks("cpu1 1 x 3 4"), None);
    }

    #[test]
    fn the_other_cpu_is_read_where_the_machine_has_it() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus > REST_CPU {
            let first = rest_cpu().expect("a /proc/stat line for the CPU");
            assert!(rest_cpu().expect("read again") >= first);
        }
    }
}
