//! What `/proc` says about other processes: CPU time and parentage, for the relay and database
//! figures of `bench relay`.

use std::path::Path;

/// Linux reports CPU times in `/proc` in clock ticks of USER_HZ, 100 a second.
const TICKS_PER_SECOND: f64 = 100.0;

/// The fields of a `/proc/…/stat` file after the command name (so index 0 is the state, 1
/// the parent's pid, 11 and 12 user and system time, 13 and 14 those of waited-for
/// children); empty when it cannot be read.
fn stat_fields(path: &Path) -> Vec<String> {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    stat.rsplit_once(") ")
        .map(|(_, rest)| rest.split(' ').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The field at `index` of `fields` as a number; 0 when missing.
fn number(fields: &[String], index: usize) -> f64 {
    fields
        .get(index)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// User + system CPU seconds in a `/proc` stat file (of a process or one of its threads); 0
/// when it cannot be read.
pub(super) fn cpu_seconds(stat: &Path) -> f64 {
    let fields = stat_fields(stat);
    (number(&fields, 11) + number(&fields, 12)) / TICKS_PER_SECOND
}

/// The parent of process `pid`, if it runs.
pub(super) fn parent(pid: u32) -> Option<u32> {
    stat_fields(Path::new(&format!("/proc/{pid}/stat")))
        .get(1)?
        .parse()
        .ok()
}

/// The command name of process `pid`, if it runs.
pub(super) fn command_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_owned())
}

/// CPU seconds of process `root` and of its children: its own time, that of its children
/// that ended (and were waited for), and that of those running now. Grandchildren are not
/// looked for (a PostgreSQL server's processes are all children of its postmaster). A child
/// that ends between two readings moves from the running sum to the ended one, so the
/// difference of two readings stays right.
pub(super) fn tree_cpu_seconds(root: u32) -> f64 {
    let own = stat_fields(Path::new(&format!("/proc/{root}/stat")));
    let mut ticks = (11..=14).map(|i| number(&own, i)).sum::<f64>();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if !is_pid {
            continue;
        }
        let fields = stat_fields(&entry.path().join("stat"));
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(root) {
            ticks += number(&fields, 11) + number(&fields, 12);
        }
    }
    ticks / TICKS_PER_SECOND
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_knows_its_parent_and_its_cpu_time() {
        let me = std::process::id();
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id()));
        let own = cpu_seconds(Path::new("/proc/self/stat"));
        // Read later, and with the children's time on top: never less.
        assert!(tree_cpu_seconds(me) >= own);
    }
}
