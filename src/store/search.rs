//! Turning free text into a safe FTS5 query, and blending relevance with recency.

use jiff::Timestamp;

use crate::protocol::ValidationError;

/// The longest search or recall query, in characters.
pub const MAX_QUERY_CHARS: usize = 1000;
/// Words beyond this many are ignored.
const MAX_TERMS: usize = 32;
/// How many best text matches are re-ranked with recency.
pub(super) const CANDIDATES: usize = 200;
/// Recency's weight halves every this many days.
const HALF_LIFE_DAYS: f64 = 30.0;

/// Builds an FTS5 query that matches any of the words, each quoted so that no input is ever
/// read as FTS5 syntax. `None` when the text holds no words.
pub(super) fn fts_query(text: &str) -> Result<Option<String>, ValidationError> {
    let len = text.chars().count();
    if len > MAX_QUERY_CHARS {
        return Err(ValidationError::too_long(
            "query",
            len,
            MAX_QUERY_CHARS,
            "characters",
        ));
    }
    let terms: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_TERMS)
        .map(|w| format!("\"{w}\""))
        .collect();
    Ok((!terms.is_empty()).then(|| terms.join(" OR ")))
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
            fts_query("deploy \"prod\" OR NEAR(x)").unwrap().unwrap(),
            "\"deploy\" OR \"prod\" OR \"OR\" OR \"NEAR\" OR \"x\""
        );
        assert_eq!(fts_query("  *** ").unwrap(), None);
        assert!(fts_query(&"a".repeat(MAX_QUERY_CHARS)).is_ok());
        assert_eq!(
            fts_query(&"a".repeat(MAX_QUERY_CHARS + 1))
                .unwrap_err()
                .field,
            "query"
        );
    }
}
