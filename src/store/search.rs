//! Turning free text into a safe FTS5 query, finding the best matches without scoring every
//! one, and blending relevance with recency.

use std::collections::HashMap;

use jiff::Timestamp;
use rusqlite::{Connection, params};

use crate::protocol::ValidationError;

/// The longest search or recall query, in characters.
pub const MAX_QUERY_CHARS: usize = 1000;
/// Words beyond this many are ignored.
const MAX_TERMS: usize = 32;
/// How many best text matches are re-ranked with recency for each result asked for, and
/// the bounds on that number.
const CANDIDATES_PER_RESULT: usize = 5;
const MIN_CANDIDATES: usize = 50;
const MAX_CANDIDATES: usize = 200;
/// A query with at most this many matches has every match scored; beyond it, the matches of
/// its rarer words (up to this many) and its newest this many matches are (see [`candidates`]).
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

/// The best text matches of any of `terms` by BM25 (lower is better), enough to re-rank for
/// `limit` results (5 each, 50 to 200), as `(rowid, bm25, time)`, the time read from the
/// indexed table in the same pass.
///
/// Scoring costs about a microsecond per match, and FTS5's `bm25` first walks every match of
/// each word to weigh it, while a common word matches tens of thousands of rows. So every
/// match is scored only when the words together match at most [`SCORED`] rows. Otherwise the
/// candidates are the matches of the query's rare words (each in at most [`SCORED`] rows,
/// rarest first, up to [`SCORED`] together), scored on those words alone; and when no word is
/// rare, the newest [`SCORED`] matches. A row that holds only common words is then found only
/// if it is among the newest.
pub(super) fn candidates(
    conn: &Connection,
    index: FtsIndex,
    terms: &[String],
    limit: usize,
) -> rusqlite::Result<Vec<(i64, f64, i64)>> {
    let depth = (limit * CANDIDATES_PER_RESULT).clamp(MIN_CANDIDATES, MAX_CANDIDATES) as i64;
    let FtsIndex {
        name,
        weights,
        table,
        time,
        findable,
    } = index;
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
    if matches(&any)? <= SCORED {
        let mut all = conn.prepare_cached(&format!(
            "SELECT t.seq, hit.score, t.{time}
             FROM (SELECT rowid, bm25({name}, {weights}) AS score FROM {name} WHERE {name} MATCH ?1 ORDER BY score LIMIT ?2) AS hit
             JOIN {table} t ON t.seq = hit.rowid AND {findable}"
        ))?;
        return all
            .query_map(params![any, depth], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect();
    }
    let mut rare = Vec::new();
    for term in terms {
        let n = matches(term)?;
        if n <= SCORED {
            rare.push((n, term.as_str()));
        }
    }
    rare.sort_unstable();
    let mut left = SCORED;
    let rare: Vec<&str> = rare
        .into_iter()
        .take_while(|&(n, _)| {
            let fits = n <= left;
            left = left.saturating_sub(n);
            fits
        })
        .map(|(_, term)| term)
        .collect();
    let mut found: Vec<(i64, f64)> = if rare.is_empty() {
        let mut newest = conn.prepare_cached(&format!(
            "SELECT rowid, bm25({name}, {weights}) FROM {name} WHERE {name} MATCH ?1 ORDER BY rowid DESC LIMIT ?2"
        ))?;
        newest
            .query_map(params![any, SCORED as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?
    } else {
        best.query_map(params![rare.join(" OR "), depth], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?
    };
    found.sort_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
    found.truncate(depth as usize);
    // Their times in one statement: a lookup per candidate costs more than scoring it.
    let seqs = serde_json::to_string(&found.iter().map(|f| f.0).collect::<Vec<_>>())
        .expect("integers serialize");
    let mut times = conn.prepare_cached(&format!(
        "SELECT t.seq, t.{time} FROM json_each(?1) AS c JOIN {table} t ON t.seq = c.value AND {findable}"
    ))?;
    let times: HashMap<i64, i64> = times
        .query_map([seqs], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(found
        .into_iter()
        .filter_map(|(seq, score)| Some((seq, score, *times.get(&seq)?)))
        .collect())
}

/// Relevance (SQLite's bm25, where lower is better) times a recency factor between 1 and 2:
/// a fresh match counts up to twice an equally relevant old one.
pub(super) fn blended_score(bm25: f64, updated: Timestamp, now: Timestamp) -> f64 {
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
