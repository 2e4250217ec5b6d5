//! A relay's database as the operator names it with `--db`: a SQLite file, or a PostgreSQL URL
//! (shown without its password).

use std::path::Path;

use crate::relay::storage::{is_postgres_url, redact_url};

/// The PostgreSQL URL `db` is, if it is one.
pub(super) fn postgres_url(db: &Path) -> Option<&str> {
    db.to_str().filter(|d| is_postgres_url(d))
}

/// `db` as shown: a URL without its password, or the file's path.
pub(super) fn shown(db: &Path) -> String {
    match postgres_url(db) {
        Some(url) => redact_url(url),
        None => db.display().to_string(),
    }
}
