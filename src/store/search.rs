//! Turning free text into a safe FTS5 query, finding the best matches without scoring every
//! one, and blending relevance with recency.

use std::collections::HashMap;

use jiff::Timestamp;
use rusqlite::{Connection, params};

use super::StoreError;
use super::time::from_ms;
use crate::protocol::{ValidationError, now_millis};

/// The longest search or recall query, in characters.
pub const MAX_QUERY_CHARS: usize = 1000;
/// Words beyond this many are ignored.
const MAX_TERMS: usize = 32;
/// How many best text matches are re-ranked with recency for each result asked for, and
/// the bounds on that number.
const CANDIDATES_PER_RESULT: usize = 5;
const MIN_CANDIDATES: usize = 50;
const MAX_CANDIDATES: usize = 200;
/// The most results one search or recall returns, whatever its limit: those ranked.
pub const MAX_SEARCH_RESULTS: usize = MAX_CANDIDATES;
/// A query with at most this many matches has every match scored; beyond it, the matches of
/// its rarer words (up to this many) and its newest this many matches are (see [`ranked`]).
const SCORED: usize = 400;
/// Recency's weight halves every this many days.
const HALF_LIFE_DAYS: f64 = 30.0;

/// An FTS5 index over a table, its columns' weights for BM25, and where the indexed table
/// keeps each row's time.
#[derive(Debug, Clone, Copy)]
pub(super) struct FtsIndex {
    /// The FTS5 table.
    pub name: &'static str,
    /// `bm25`'s weight arguments, one per column.
    pub weights: &'static str,
    /// The indexed table, whose `seq` is the index's rowid.
    pub table: &'static str,
    /// The column of `table` that recency is measured from (Unix ms).
    pub time: &'static str,
    /// A condition on `table`'s rows that may be found (`1` for all).
    pub findable: &'static str,
    /// An index on `table(seq, time)` under the condition `findable`, which the times are read
    /// from instead of the rows; without one, the rows are read.
    pub times_index: Option<&'static str>,
}

/// The candidates' times (`?1`: their rowids as a JSON array), in one statement: a lookup per
/// candidate costs more than scoring it.
pub(super) fn times_sql(index: &FtsIndex) -> String {
    let FtsIndex {
        table,
        time,
        findable,
        times_index,
        ..
    } = index;
    // Named, or the planner takes the rowid and reads each whole row.
    let by = times_index.map_or(String::new(), |i| format!("INDEXED BY {i}"));
    format!(
        "SELECT t.seq, t.{time} FROM json_each(?1) AS c JOIN {table} t {by} ON t.seq = c.value AND {findable}"
    )
}

/// The words of a query, each quoted so that no input is ever read as FTS5 syntax. Empty when
/// the text holds no words.
pub(super) fn fts_terms(text: &str) -> Result<Vec<String>, ValidationError> {
    let len = text.chars().count();
    if len > MAX_QUERY_CHARS {
        return Err(ValidationError::too_long(
            "query",
            len,
            MAX_QUERY_CHARS,
            "characters",
        ));
    }
    Ok(text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_TERMS)
        .map(|w| format!("\"{w}\""))
        .collect())
}

/// The rows of `index` best matching any of `terms`, best first, at most `limit`, as
/// `(rowid, score)`: BM25 blended with recency (see [`blended_score`]), higher is better.
/// Ranked on the index and the rows' times alone; callers read only what is returned.
///
/// The best BM25 matches are re-ranked, 5 per result asked (50 to 200). Scoring costs about
/// a microsecond per match, and FTS5's `bm25` first walks every match of each word to weigh
/// it, while a common word matches tens of thousands of rows. So every match is scored only
/// when the words together match at most [`SCORED`] rows. Otherwise the candidates are the
/// matches of the query's rare words (rarest first, at most [`SCORED`] together), scored on
/// those words alone; and when no word is rare, the newest [`SCORED`] matches. A row that
/// holds only common words is then found only if it is among the newest.
pub(super) fn ranked(
    conn: &Connection,
    index: FtsIndex,
    terms: &[String],
    limit: usize,
) -> Result<Vec<(i64, f64)>, StoreError> {
    let depth = (limit * CANDIDATES_PER_RESULT).clamp(MIN_CANDIDATES, MAX_CANDIDATES);
    let FtsIndex { name, weights, .. } = index;
    let any = terms.join(" OR ");
    // Counting stops one past the bound: cheap however common the words are.
    let mut count = conn.prepare_cached(&format!(
        "SELECT count(*) FROM (SELECT rowid FROM {name} WHERE {name} MATCH ?1 LIMIT ?2)"
    ))?;
    let mut matches = |query: &str| {
        count.query_row(params![query, (SCORED + 1) as i64], |r| {
            r.get::<_, i64>(0).map(|n| n as usize)
        })
    };
    let mut best = conn.prepare_cached(&format!(
        "SELECT rowid, bm25({name}, {weights}) AS score FROM {name} WHERE {name} MATCH ?1 ORDER BY score LIMIT ?2"
    ))?;
    let mut best_of = |query: &str| -> rusqlite::Result<Vec<(i64, f64)>> {
        best.query_map(params![query, depth as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    };
    let candidates = if matches(&any)? <= SCORED {
        best_of(&any)?
    } else {
        let mut counted = Vec::with_capacity(terms.len());
        for term in terms {
            counted.push((matches(term)?, term.as_str()));
        }
        counted.sort_unstable();
        let (mut left, mut rare) = (SCORED, Vec::new());
        for (n, term) in counted {
            if n > left {
                break;
            }
            left -= n;
            rare.push(term);
        }
        if rare.is_empty() {
            let mut newest = conn.prepare_cached(&format!(
                "SELECT rowid, bm25({name}, {weights}) FROM {name} WHERE {name} MATCH ?1 ORDER BY rowid DESC LIMIT ?2"
            ))?;
            let mut found: Vec<(i64, f64)> = newest
                .query_map(params![any, SCORED as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            found.sort_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
            found.truncate(depth);
            found
        } else {
            best_of(&rare.join(" OR "))?
        }
    };
    let seqs = serde_json::to_string(&candidates.iter().map(|c| c.0).collect::<Vec<_>>())
        .expect("integers serialize");
    let mut times = conn.prepare_cached(&times_sql(&index))?;
    let times: HashMap<i64, i64> = times
        .query_map([seqs], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let now = now_millis();
    let mut scored = Vec::with_capacity(candidates.len());
    for (seq, bm25) in candidates {
        if let Some(&at) = times.get(&seq) {
            scored.push((seq, blended_score(bm25, from_ms(at)?, now)));
        }
    }
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(limit);
    Ok(scored)
}

/// Relevance (SQLite's bm25, where lower is better) times a recency factor between 1 and 2:
/// a fresh match counts up to twice an equally relevant old one.
fn blended_score(bm25: f64, updated: Timestamp, now: Timestamp) -> f64 {
    let age_days = (now.as_millisecond() - updated.as_millisecond()).max(0) as f64 / 86_400_000.0;
    let recency = 0.5f64.powf(age_days / HALF_LIFE_DAYS);
    -bm25 * (1.0 + recency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_quoted_words() {
        assert_eq!(
            fts_terms("deploy \"prod\" OR NEAR(x)")
                .unwrap()
                .join(" OR "),
            "\"deploy\" OR \"prod\" OR \"OR\" OR \"NEAR\" OR \"x\""
        );
        assert!(fts_terms("  *** ").unwrap().is_empty());
        assert!(fts_terms(&"a".repeat(MAX_QUERY_CHARS)).is_ok());
        assert_eq!(
            fts_terms(&"a".repeat(MAX_QUERY_CHARS + 1))
                .unwrap_err()
                .field,
            "query"
        );
    }
}
