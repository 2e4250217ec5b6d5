//! The storage's account of itself: what a scan of the spool found, logged and counted at
//! every open, and `mailslot relay check`, which checks the database and the spool offline
//! without changing either.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::clock::now_ms;
use super::index::QueueIndex;
use super::scan::{self, Scan};
use super::schema;
use super::spool;
use crate::storage::{CheckReport, DatabaseReport, SpoolReport, StorageError};

/// The report of `scan`, with what each damaged record costs now that `index` holds the intact
/// records.
pub(super) fn spool_report(scan: Scan, index: &QueueIndex, now_ms: i64) -> SpoolReport {
    let damaged = scan
        .damaged
        .into_iter()
        .map(|d| {
            d.loss(
                |r| {
                    r.recipient
                        .as_ref()
                        .zip(r.seq)
                        .and_then(|(to, seq)| index.fate(to, seq))
                },
                now_ms,
            )
        })
        .collect();
    SpoolReport {
        segments: scan.segments.len(),
        copies_waiting: index.total_waiting(),
        damaged,
        unclosed: scan.unclosed,
    }
}

/// Logs what the open of the database at `db` found in its spool: each damaged record as an
/// error (routing fields only), and one summary line.
pub(super) fn log(report: &SpoolReport, db: &Path) {
    if let Some(unclosed) = &report.unclosed {
        tracing::info!(
            segment = unclosed.segment,
            end = unclosed.end,
            "spool segment {:08} was not closed (the relay stopped without shutting down): its records end at byte {}, anything after them was being written then; closed it there",
            unclosed.segment,
            unclosed.end
        );
    }
    for damaged in &report.damaged {
        tracing::error!(
            segment = damaged.segment,
            offset = damaged.offset,
            "damaged spool record: {damaged}"
        );
    }
    if report.damaged.is_empty() {
        tracing::info!("spool opened: {}", report.summary());
    } else {
        tracing::error!(
            damaged = report.damaged.len(),
            lost_copies = report.lost_copies(),
            "the spool is DAMAGED: {}. The relay starts with every intact copy; with it stopped, `mailslot relay check --db {}` lists the damage again",
            report.summary(),
            db.display()
        );
    }
}

/// Checks the database at `path` (`PRAGMA integrity_check`, its schema) and its spool (every
/// record), reading only.
pub(super) fn check(path: &Path) -> Result<CheckReport, StorageError> {
    if !path.is_file() {
        return Err(StorageError::Database(format!(
            "no relay database at {}; pass the relay's --db",
            path.display()
        )));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let problems = conn
        .prepare("PRAGMA integrity_check")?
        .query_map([], |r| r.get::<_, String>(0))?
        .filter(|line| !matches!(line.as_deref(), Ok("ok")))
        .collect::<Result<Vec<_>, _>>()?;
    let scan = scan::scan(&spool::dir_of(path))?;
    let now = now_ms();
    let index = QueueIndex::load(&scan.segments, now);
    Ok(CheckReport {
        database: DatabaseReport {
            schema: version.max(0) as usize,
            current_schema: schema::MIGRATIONS.len(),
            problems,
        },
        spool: spool_report(scan, &index, now),
    })
}
