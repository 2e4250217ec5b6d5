//! File reservations: leases that agents sharing a repository take on paths and globs, kept
//! by the relay in a project's namespace. The rules of what a valid project, pattern, reason
//! and TTL are, when two patterns may touch the same file, and when two reservations conflict.

use std::fmt;
use std::str::FromStr;

use globset::{GlobBuilder, GlobMatcher};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{AgentName, ReservationId, ValidationError};

/// The longest project name, in characters.
pub const MAX_PROJECT_CHARS: usize = 64;
/// The most patterns one reservation holds.
pub const MAX_PATTERNS: usize = 16;
/// The longest pattern, in characters.
pub const MAX_PATTERN_CHARS: usize = 200;
/// The longest reason, in characters.
pub const MAX_REASON_CHARS: usize = 200;
/// The shortest TTL the protocol carries; a relay may ask for more (`reservation_min_ttl_secs`).
pub const MIN_TTL_SECS: u32 = 1;
/// The longest TTL, one day: a reservation is renewed, never forgotten.
pub const MAX_TTL_SECS: u32 = 24 * 60 * 60;
/// The TTL when none is given: one hour.
pub const DEFAULT_TTL_SECS: u32 = 60 * 60;
/// The most live reservations one agent holds in one project.
pub const MAX_HELD_PER_PROJECT: usize = 32;
/// The most live reservations in one project (so a listing stays bounded).
pub const MAX_PROJECT_RESERVATIONS: usize = 256;

/// The namespace reservations live in: a repository every agent of a relay names alike
/// (`git config mailslot.project`, else its root commit). Like an agent name: lowercase
/// letters, digits, '.', '_' and '-', starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProjectName(String);

impl ProjectName {
    /// Checks `name`.
    pub fn new(name: &str) -> Result<Self, ValidationError> {
        const FIELD: &str = "project";
        if name.is_empty() {
            return Err(ValidationError::new(
                FIELD,
                "is empty; name the project with lowercase letters, digits, '.', '_' or '-' (`git config mailslot.project NAME`)",
            ));
        }
        let len = name.chars().count();
        if len > MAX_PROJECT_CHARS {
            return Err(ValidationError::too_long(
                FIELD,
                len,
                MAX_PROJECT_CHARS,
                "characters",
            ));
        }
        for (i, c) in name.chars().enumerate() {
            let ok = c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || (i > 0 && matches!(c, '.' | '_' | '-'));
            if !ok {
                return Err(ValidationError::new(
                    FIELD,
                    format!(
                        "{:?} has {c:?} at position {}; a project is lowercase letters, digits, '.', '_' and '-', and starts with a letter or digit",
                        truncate(name),
                        i + 1
                    ),
                ));
            }
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ProjectName {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for ProjectName {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<ProjectName> for String {
    fn from(p: ProjectName) -> Self {
        p.0
    }
}

/// A repository-relative path or glob (`src/relay/**`, `docs/*.md`, `Cargo.toml`), in its
/// canonical form: no leading `./`, no trailing `/`. `*`, `?`, `[…]` and `{a,b}` stay within
/// one path segment; `**` (a whole segment) spans any number of them. A pattern holds every
/// path it matches and everything under a directory it matches, as `.gitignore` does: `src`
/// holds `src/main.rs`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Pattern(String);

/// Characters that make a segment a glob rather than a name.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}'];

impl Pattern {
    /// Checks `raw` and puts it in canonical form.
    pub fn new(raw: &str) -> Result<Self, ValidationError> {
        const FIELD: &str = "pattern";
        let len = raw.chars().count();
        if len > MAX_PATTERN_CHARS {
            return Err(ValidationError::too_long(
                FIELD,
                len,
                MAX_PATTERN_CHARS,
                "characters",
            ));
        }
        let refuse = |problem: String| Err(ValidationError::new(FIELD, problem));
        if raw.chars().any(char::is_control) {
            return refuse(format!(
                "{:?} has a control character; give a path relative to the repository's root",
                truncate(raw)
            ));
        }
        if raw.starts_with('/') {
            return refuse(format!(
                "{:?} is absolute; give it relative to the repository's root (like src/main.rs)",
                truncate(raw)
            ));
        }
        if raw.contains('\\') {
            return refuse(format!(
                "{:?} has a backslash; separate directories with '/'",
                truncate(raw)
            ));
        }
        let trimmed = raw.strip_prefix("./").unwrap_or(raw);
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        if trimmed.is_empty() {
            return refuse(
                "is empty; give a path or glob relative to the repository's root (`**` for all of it)"
                    .to_owned(),
            );
        }
        for segment in trimmed.split('/') {
            match segment {
                "" => {
                    return refuse(format!(
                        "{:?} has an empty directory ('//'); write each '/' once",
                        truncate(raw)
                    ));
                }
                "." | ".." => {
                    return refuse(format!(
                        "{:?} has a {segment:?} segment; give the path from the repository's root without '.' or '..'",
                        truncate(raw)
                    ));
                }
                s if s.contains("**") && s != "**" => {
                    return refuse(format!(
                        "{:?} has '**' inside a segment ({s:?}); '**' stands alone between slashes (src/**/*.rs)",
                        truncate(raw)
                    ));
                }
                _ => {}
            }
        }
        let pattern = Self(trimmed.to_owned());
        if let Err(e) = pattern.glob() {
            return refuse(format!("{:?} is not a valid glob: {e}", truncate(raw)));
        }
        Ok(pattern)
    }

    /// The pattern as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn glob(&self) -> Result<GlobMatcher, globset::Error> {
        Ok(GlobBuilder::new(&self.0)
            .literal_separator(true)
            .backslash_escape(false)
            .build()?
            .compile_matcher())
    }

    /// A matcher for paths: the pattern's own [`Pattern::holds`] in a form to reuse.
    pub fn matcher(&self) -> PathMatcher {
        PathMatcher(self.glob().expect("checked when the pattern was made"))
    }

    /// Whether the pattern holds `path` (repository-relative, '/'-separated): it matches the
    /// path or a directory above it.
    pub fn holds(&self, path: &str) -> bool {
        self.matcher().holds(path)
    }

    /// Whether some path may be held by both patterns. Never false when one path is (it errs
    /// toward true): the segments are compared pairwise up to the shorter pattern's end (a
    /// pattern holds everything under what it matches); a `**` makes the rest overlap; two
    /// names must be equal; a name and a glob overlap when the glob matches the name; two
    /// globs overlap unless their literal beginnings or endings disagree (a `{…}` always
    /// overlaps).
    pub fn overlaps(&self, other: &Pattern) -> bool {
        for (a, b) in self.0.split('/').zip(other.0.split('/')) {
            if a == "**" || b == "**" {
                return true;
            }
            if !segments_overlap(a, b) {
                return false;
            }
        }
        true
    }
}

/// Whether one segment of each pattern may match the same name.
fn segments_overlap(a: &str, b: &str) -> bool {
    let is_glob = |s: &str| s.contains(GLOB_CHARS);
    match (is_glob(a), is_glob(b)) {
        (false, false) => a == b,
        (true, false) => segment_matches(a, b),
        (false, true) => segment_matches(b, a),
        (true, true) => {
            if a.contains('{') || b.contains('{') {
                return true;
            }
            let (pa, pb) = (literal_start(a), literal_start(b));
            let (sa, sb) = (literal_end(a), literal_end(b));
            (pa.starts_with(pb) || pb.starts_with(pa)) && (sa.ends_with(sb) || sb.ends_with(sa))
        }
    }
}

/// Whether the one-segment glob `glob` matches `name`; an unreadable glob overlaps.
fn segment_matches(glob: &str, name: &str) -> bool {
    GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(false)
        .build()
        .map(|g| g.compile_matcher().is_match(name))
        .unwrap_or(true)
}

/// What a glob segment starts with before its first glob character.
fn literal_start(s: &str) -> &str {
    s.find(GLOB_CHARS).map_or(s, |i| &s[..i])
}

/// What a glob segment ends with after its last glob character.
fn literal_end(s: &str) -> &str {
    s.rfind(GLOB_CHARS).map_or(s, |i| &s[i + 1..])
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Pattern {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for Pattern {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<Pattern> for String {
    fn from(p: Pattern) -> Self {
        p.0
    }
}

/// A compiled [`Pattern`], for checking many paths.
#[derive(Debug, Clone)]
pub struct PathMatcher(GlobMatcher);

impl PathMatcher {
    /// Whether the pattern matches `path` or a directory above it.
    pub fn holds(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        path.match_indices('/')
            .map(|(i, _)| &path[..i])
            .chain(std::iter::once(path))
            .any(|p| self.0.is_match(p))
    }
}

/// Checks the patterns of one request: at least one, at most [`MAX_PATTERNS`], each valid.
pub fn validate_patterns(patterns: &[Pattern]) -> Result<(), ValidationError> {
    if patterns.is_empty() {
        return Err(ValidationError::new(
            "patterns",
            "is empty; name at least one path or glob",
        ));
    }
    if patterns.len() > MAX_PATTERNS {
        return Err(ValidationError::new(
            "patterns",
            format!(
                "has {} patterns, over the limit of {MAX_PATTERNS}; use a glob (src/relay/**) or reserve in several calls",
                patterns.len()
            ),
        ));
    }
    Ok(())
}

/// Whether others may hold the same files too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationMode {
    /// Only its holder works on the files: conflicts with any other holder's reservation.
    Exclusive,
    /// Others may read or share them: conflicts only with another holder's exclusive one.
    Shared,
}

impl ReservationMode {
    /// The name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationMode::Exclusive => "exclusive",
            ReservationMode::Shared => "shared",
        }
    }
}

impl fmt::Display for ReservationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the files are held: one line, for the other agents and their people.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Reason(String);

impl Reason {
    /// Checks `text`: one line of at most [`MAX_REASON_CHARS`], not empty.
    pub fn new(text: &str) -> Result<Self, ValidationError> {
        const FIELD: &str = "reason";
        let text = text.trim();
        if text.is_empty() {
            return Err(ValidationError::new(
                FIELD,
                "is empty; say in one line why the files are held (other agents see it)",
            ));
        }
        let len = text.chars().count();
        if len > MAX_REASON_CHARS {
            return Err(ValidationError::too_long(
                FIELD,
                len,
                MAX_REASON_CHARS,
                "characters",
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(ValidationError::new(
                FIELD,
                "has a line break or control character; give one line",
            ));
        }
        Ok(Self(text.to_owned()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Reason {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> Self {
        r.0
    }
}

/// How long a reservation lasts from its reservation or last renewal, in seconds
/// ([`MIN_TTL_SECS`]..=[`MAX_TTL_SECS`]); written `90s`, `30m`, `1h`, `1h30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Ttl(u32);

impl Ttl {
    /// Checks a number of seconds.
    pub fn from_secs(secs: u32) -> Result<Self, ValidationError> {
        if !(MIN_TTL_SECS..=MAX_TTL_SECS).contains(&secs) {
            return Err(ValidationError::new(
                "ttl",
                format!(
                    "is {secs} s; give between {MIN_TTL_SECS} s and {} h (like 30m or 2h), and renew a reservation to keep it longer",
                    MAX_TTL_SECS / 3600
                ),
            ));
        }
        Ok(Self(secs))
    }

    /// Reads `90s`, `30m`, `1h`, `1h30m` or a number of seconds.
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let bad = || {
            ValidationError::new(
                "ttl",
                format!(
                    "{:?} is not a duration; write it like 90s, 30m, 1h or 1h30m",
                    truncate(text)
                ),
            )
        };
        let text = text.trim();
        if let Ok(secs) = text.parse::<u32>() {
            return Self::from_secs(secs);
        }
        let (mut total, mut digits) = (0u64, String::new());
        for c in text.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                if digits.len() > 6 {
                    return Err(bad());
                }
                continue;
            }
            let unit = match c {
                'h' => 3600,
                'm' => 60,
                's' => 1,
                _ => return Err(bad()),
            };
            let n: u64 = digits.parse().map_err(|_| bad())?;
            total += n * unit;
            digits.clear();
        }
        if !digits.is_empty() || text.is_empty() {
            return Err(bad());
        }
        Self::from_secs(u32::try_from(total).unwrap_or(u32::MAX))
    }

    /// The seconds.
    pub fn secs(self) -> u32 {
        self.0
    }
}

impl Default for Ttl {
    fn default() -> Self {
        Self(DEFAULT_TTL_SECS)
    }
}

impl TryFrom<u32> for Ttl {
    type Error = ValidationError;
    fn try_from(secs: u32) -> Result<Self, Self::Error> {
        Self::from_secs(secs)
    }
}

impl From<Ttl> for u32 {
    fn from(t: Ttl) -> Self {
        t.0
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (h, m, s) = (self.0 / 3600, self.0 % 3600 / 60, self.0 % 60);
        let mut out = String::new();
        if h > 0 {
            out.push_str(&format!("{h}h"));
        }
        if m > 0 {
            out.push_str(&format!("{m}m"));
        }
        if s > 0 || out.is_empty() {
            out.push_str(&format!("{s}s"));
        }
        f.write_str(&out)
    }
}

/// A live reservation, as the relay keeps and shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    /// Its id.
    pub id: ReservationId,
    /// The project it is in.
    pub project: ProjectName,
    /// The agent that holds it: the one authenticated when it was made, never a field it sent.
    pub holder: AgentName,
    /// What it holds.
    pub patterns: Vec<Pattern>,
    /// Exclusive or shared.
    pub mode: ReservationMode,
    /// Why.
    pub reason: Reason,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it lapses unless renewed.
    pub expires_at: Timestamp,
}

impl Reservation {
    /// Whether `holder` asking for `patterns` in `mode` conflicts with this reservation: not
    /// for its own holder; an exclusive side conflicts with any overlap; two shared ones never.
    pub fn conflicts_with(
        &self,
        holder: &AgentName,
        mode: ReservationMode,
        patterns: &[Pattern],
    ) -> bool {
        &self.holder != holder
            && (mode == ReservationMode::Exclusive || self.mode == ReservationMode::Exclusive)
            && self
                .patterns
                .iter()
                .any(|held| patterns.iter().any(|p| held.overlaps(p)))
    }

    /// This reservation's patterns that hold `path`.
    pub fn holding<'a>(&'a self, path: &'a str) -> impl Iterator<Item = &'a Pattern> + 'a {
        self.patterns.iter().filter(move |p| p.holds(path))
    }
}

/// What a reservation asks for: everything but the holder, which is the asking session's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationRequest {
    /// The project.
    pub project: ProjectName,
    /// At least one, at most [`MAX_PATTERNS`].
    pub patterns: Vec<Pattern>,
    /// Exclusive or shared.
    pub mode: ReservationMode,
    /// Why.
    pub reason: Reason,
    /// How long.
    pub ttl: Ttl,
}

/// An agent was refused files another holds: told to that holder's session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Waiting {
    /// The agent that waits.
    pub by: AgentName,
    /// The project.
    pub project: ProjectName,
    /// What it asked for.
    pub patterns: Vec<Pattern>,
    /// Why it wants them: its words (another agent's text, framed before a model sees it).
    pub reason: Reason,
    /// The holder's reservations in its way.
    pub held: Vec<ReservationId>,
}

/// Keeps error messages short when the bad value is huge.
fn truncate(s: &str) -> String {
    s.chars().take(48).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::new(s).unwrap()
    }

    #[test]
    fn patterns_are_relative_bounded_and_canonical() {
        assert_eq!(p("./src/").as_str(), "src");
        assert_eq!(p("src/**/*.rs").as_str(), "src/**/*.rs");
        for (bad, why) in [
            ("/etc/passwd", "absolute"),
            ("src/../secret", "'..'"),
            ("./", "empty"),
            ("src//a", "'//'"),
            ("src\\a", "backslash"),
            ("src/a**b", "'**'"),
            ("src/[a", "not a valid glob"),
            ("a\nb", "control"),
        ] {
            let e = Pattern::new(bad).unwrap_err();
            assert_eq!(e.field, "pattern");
            assert!(e.problem.contains(why), "{bad}: {}", e.problem);
        }
        let long = "a".repeat(MAX_PATTERN_CHARS + 1);
        assert!(Pattern::new(&long).unwrap_err().problem.contains("200"));
        assert!(validate_patterns(&[]).is_err());
        assert!(validate_patterns(&vec![p("a"); MAX_PATTERNS + 1]).is_err());
        assert!(serde_json::from_str::<Pattern>("\"/abs\"").is_err());
    }

    #[test]
    fn a_pattern_holds_what_it_matches_and_everything_under_it() {
        assert!(p("src/main.rs").holds("src/main.rs"));
        assert!(!p("src/main.rs").holds("src/main.rs.bak"));
        assert!(p("src").holds("src/relay/mod.rs"));
        assert!(p("src/*").holds("src/relay/mod.rs"));
        assert!(p("src/*.rs").holds("src/lib.rs"));
        assert!(!p("src/*.rs").holds("src/relay/mod.rs"));
        assert!(p("src/**/*.rs").holds("src/relay/mod.rs"));
        assert!(p("**").holds("anything/at/all"));
        assert!(p("docs/{cli,mcp}.md").holds("docs/mcp.md"));
        assert!(!p("docs/{cli,mcp}.md").holds("docs/protocol.md"));
    }

    #[test]
    fn overlap_never_misses_a_path_both_hold() {
        let paths = [
            "src/main.rs",
            "src/lib.rs",
            "src/relay/mod.rs",
            "src/relay/session/requests.rs",
            "docs/cli.md",
            "docs/mcp.md",
            "tests/it/main.rs",
            "Cargo.toml",
            "src/protocol/reservation.rs",
        ];
        let patterns = [
            "src/main.rs",
            "src",
            "src/*",
            "src/*.rs",
            "src/**",
            "src/**/*.rs",
            "src/relay/**",
            "src/re*",
            "src/*lay",
            "src/r?lay/mod.rs",
            "src/[rp]*/*.rs",
            "docs/*.md",
            "docs/{cli,mcp}.md",
            "*.toml",
            "**/*.md",
            "tests",
            "**",
        ];
        for a in patterns {
            for b in patterns {
                let (pa, pb) = (p(a), p(b));
                let both = paths.iter().any(|path| pa.holds(path) && pb.holds(path));
                if both {
                    assert!(pa.overlaps(&pb), "{a} and {b} both hold a path");
                }
                assert_eq!(pa.overlaps(&pb), pb.overlaps(&pa), "{a} {b} symmetric");
            }
        }
    }

    #[test]
    fn overlap_says_no_where_it_can_tell() {
        for (a, b) in [
            ("src/main.rs", "src/lib.rs"),
            ("src/relay/**", "src/client/**"),
            ("src/*.rs", "src/*.md"),
            ("docs/*.md", "src/**"),
            ("src/re*", "src/cl*"),
            ("src/relay/mod.rs", "src/*/x.rs"),
        ] {
            assert!(!p(a).overlaps(&p(b)), "{a} {b}");
        }
        // Conservative: two globs with compatible literal ends are taken to overlap.
        assert!(p("src/a*z").overlaps(&p("src/ab*")));
    }

    fn held(holder: &str, mode: ReservationMode, patterns: &[&str]) -> Reservation {
        Reservation {
            id: ReservationId::new(),
            project: ProjectName::new("demo").unwrap(),
            holder: AgentName::new(holder).unwrap(),
            patterns: patterns.iter().map(|s| p(s)).collect(),
            mode,
            reason: Reason::new("work").unwrap(),
            created_at: Timestamp::now(),
            expires_at: Timestamp::now(),
        }
    }

    #[test]
    fn exclusive_conflicts_with_any_other_holder_and_shared_only_with_exclusive() {
        use ReservationMode::{Exclusive, Shared};
        let bob = AgentName::new("bob").unwrap();
        let alice = AgentName::new("alice").unwrap();
        let src = [p("src/main.rs")];
        assert!(held("alice", Exclusive, &["src/**"]).conflicts_with(&bob, Shared, &src));
        assert!(held("alice", Shared, &["src/**"]).conflicts_with(&bob, Exclusive, &src));
        assert!(!held("alice", Shared, &["src/**"]).conflicts_with(&bob, Shared, &src));
        assert!(!held("alice", Exclusive, &["src/**"]).conflicts_with(&alice, Exclusive, &src));
        assert!(!held("alice", Exclusive, &["docs/**"]).conflicts_with(&bob, Exclusive, &src));
    }

    #[test]
    fn names_reasons_and_ttls_are_checked() {
        assert!(ProjectName::new("mailslot").is_ok());
        assert!(ProjectName::new("1a2b3c4d5e6f").is_ok());
        assert_eq!(ProjectName::new("My Repo").unwrap_err().field, "project");
        assert!(ProjectName::new(&"a".repeat(MAX_PROJECT_CHARS + 1)).is_err());
        assert!(Reason::new("two\nlines").is_err());
        assert!(Reason::new("  ").is_err());
        assert!(Reason::new(&"r".repeat(MAX_REASON_CHARS + 1)).is_err());
        assert_eq!(Ttl::parse("30m").unwrap().secs(), 1800);
        assert_eq!(Ttl::parse("1h30m").unwrap().secs(), 5400);
        assert_eq!(Ttl::parse("90").unwrap().secs(), 90);
        assert_eq!(Ttl::parse("1h30m").unwrap().to_string(), "1h30m");
        assert!(Ttl::parse("25h").unwrap_err().problem.contains("24 h"));
        assert!(Ttl::parse("0s").is_err());
        assert!(Ttl::parse("soon").is_err());
        assert!(Ttl::parse("99999999999h").is_err());
        assert!(serde_json::from_str::<Ttl>("0").is_err());
    }
}
