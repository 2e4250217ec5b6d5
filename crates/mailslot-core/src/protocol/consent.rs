//! Consent: who may write to whom. Owners approve contact requests with a code that only the
//! requester's owner is shown; agents can ask but never approve.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{Address, ValidationError, Waiting};

/// The longest note on a contact request, in characters.
pub const MAX_NOTE_CHARS: usize = 500;

/// Whom an agent accepts mail from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Anyone not blocked.
    Open,
    /// Approved contacts only.
    Contacts,
    /// No one.
    Closed,
}

impl Policy {
    /// The name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Open => "open",
            Policy::Contacts => "contacts",
            Policy::Closed => "closed",
        }
    }
}

impl FromStr for Policy {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(Policy::Open),
            "contacts" => Ok(Policy::Contacts),
            "closed" => Ok(Policy::Closed),
            _ => Err(ValidationError::new(
                "policy",
                format!("{s:?} is not open, contacts or closed"),
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const CODE_ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A verification code: eight base32 characters (40 bits), shown as `XXXX-XXXX`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RequestCode(String);

impl RequestCode {
    /// A code from 5 random bytes.
    pub fn from_random(bytes: [u8; 5]) -> Self {
        let mut acc = 0u64;
        for b in bytes {
            acc = (acc << 8) | u64::from(b);
        }
        let chars: String = (0..8)
            .rev()
            .map(|i| CODE_ALPHABET[((acc >> (i * 5)) & 31) as usize] as char)
            .collect();
        Self(format!("{}-{}", &chars[..4], &chars[4..]))
    }

    /// Parses a code as a person types it: any case, dash optional, O/I/L read as 0/1/1.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let cleaned: String = s
            .chars()
            .filter(|c| *c != '-' && !c.is_whitespace())
            .map(|c| match c.to_ascii_uppercase() {
                'O' => '0',
                'I' | 'L' => '1',
                c => c,
            })
            .collect();
        if cleaned.len() != 8 || !cleaned.bytes().all(|b| CODE_ALPHABET.contains(&b)) {
            return Err(ValidationError::new(
                "code",
                "is not a verification code like 7KQF-3MZA; ask the requester's owner for it",
            ));
        }
        Ok(Self(format!("{}-{}", &cleaned[..4], &cleaned[4..])))
    }

    /// The display form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the code appears in `text`, however it is cased, spaced or dashed.
    pub fn appears_in(&self, text: &str) -> bool {
        let compact: String = text
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(code_char)
            .collect();
        compact.contains(&self.0.replace('-', ""))
    }
}

/// A character as [`RequestCode::parse`] reads it: upper case, O as 0, I and L as 1.
fn code_char(c: char) -> char {
    match c.to_ascii_uppercase() {
        'O' => '0',
        'I' | 'L' => '1',
        c => c,
    }
}

/// Whether `text` holds something shaped like a code: `XXXX-XXXX` as a word of its own, with
/// a digit in it (so hyphenated words such as `data-flow` pass; the relay also refuses any
/// note holding an open code itself, however written).
fn looks_like_code(text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    let is_code = |c: char| c.is_ascii() && CODE_ALPHABET.contains(&(code_char(c) as u8));
    chars.windows(9).enumerate().any(|(i, w)| {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i + 9);
        w[4] == '-'
            && w[..4].iter().chain(&w[5..]).all(|&c| is_code(c))
            && w.iter().any(char::is_ascii_digit)
            && !before.is_some_and(|c| c.is_alphanumeric())
            && !after.is_some_and(|c| c.is_alphanumeric())
    })
}

impl fmt::Display for RequestCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RequestCode {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for RequestCode {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<RequestCode> for String {
    fn from(c: RequestCode) -> Self {
        c.0
    }
}

/// A pending contact request as one side sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestView {
    /// The other agent: the target for outgoing requests, the requester for incoming ones.
    pub agent: Address,
    /// The requester's note.
    pub note: String,
    /// When it lapses.
    pub expires_at: Timestamp,
    /// The code: present only on the requester's side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RequestCode>,
}

/// News pushed to a connected agent: consent, bounces, and others waiting for files it
/// reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ConsentEvent {
    /// Someone asked to become a contact. No code: the owner gets it out of band.
    RequestReceived {
        /// The requester.
        from: Address,
        /// Its note.
        note: String,
        /// When the request lapses.
        expires_at: Timestamp,
    },
    /// A request this agent made was approved.
    Approved {
        /// The agent whose owner approved.
        by: Address,
    },
    /// A request this agent made was denied.
    Denied {
        /// The agent whose owner denied.
        by: Address,
    },
    /// Copies of this agent's mail expired undelivered: ask for them with `bounces`.
    Bounced {},
    /// Another agent was refused files this agent reserved, and waits for them.
    Waiting(Waiting),
}

/// Checks a request note.
pub fn validate_note(note: &str) -> Result<(), ValidationError> {
    let len = note.chars().count();
    if len > MAX_NOTE_CHARS {
        return Err(ValidationError::too_long(
            "note",
            len,
            MAX_NOTE_CHARS,
            "characters",
        ));
    }
    if looks_like_code(note) {
        return Err(ValidationError::new(
            "note",
            "holds something shaped like a verification code (XXXX-XXXX); codes go from owner to owner, never through agents, so leave it out",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_render_and_parse_forgivingly() {
        let code = RequestCode::from_random([0xff, 0, 0xab, 0x12, 0x34]);
        assert_eq!(code.as_str().len(), 9);
        assert_eq!(
            RequestCode::parse(&code.as_str().to_lowercase().replace('-', "")).unwrap(),
            code
        );
        assert_eq!(
            RequestCode::parse("oooo-iiii").unwrap().as_str(),
            "0000-1111"
        );
        assert!(RequestCode::parse("ABC").is_err());
        assert!(RequestCode::parse("ABCD-EFGU").is_err());
    }

    #[test]
    fn codes_are_found_however_they_are_written() {
        let code = RequestCode::parse("7KQF-3MZA").unwrap();
        for text in [
            "approve with 7KQF-3MZA now",
            "7kqf3mza",
            "7 K Q F - 3 M Z A",
            "x7kqf.3mza.",
        ] {
            assert!(code.appears_in(text), "{text}");
        }
        assert!(!code.appears_in("7KQF-3MZB"));
        assert!(validate_note("approve 7kqf-3mza please").is_err());
        assert!(validate_note("code:7KQF-3MZA.").is_err());
        assert!(validate_note("we share the deploy-work of 2026").is_ok());
        assert!(validate_note("ABCDE-FGHJK is a long token").is_ok());
        assert!(validate_note("our data-flow and area-code work").is_ok());
    }

    #[test]
    fn a_waiting_event_round_trips_and_refuses_bad_fields() {
        let waiting = ConsentEvent::Waiting(Waiting {
            by: crate::protocol::AgentName::new("bob").unwrap(),
            project: crate::protocol::ProjectName::new("demo").unwrap(),
            patterns: vec![crate::protocol::Pattern::new("src/**").unwrap()],
            reason: crate::protocol::Reason::new("fix it").unwrap(),
            held: vec![crate::protocol::ReservationId::new()],
        });
        let wire = serde_json::to_string(&waiting).unwrap();
        assert!(
            wire.starts_with(r#"{"kind":"waiting","by":"bob""#),
            "{wire}"
        );
        assert_eq!(
            serde_json::from_str::<ConsentEvent>(&wire).unwrap(),
            waiting
        );
        let absolute = wire.replace("src/**", "/etc/**");
        assert!(serde_json::from_str::<ConsentEvent>(&absolute).is_err());
        let extra = wire.replace(r#""by""#, r#""x":1,"by""#);
        assert!(serde_json::from_str::<ConsentEvent>(&extra).is_err());
    }

    #[test]
    fn note_limit() {
        assert!(validate_note(&"n".repeat(MAX_NOTE_CHARS)).is_ok());
        assert_eq!(
            validate_note(&"n".repeat(MAX_NOTE_CHARS + 1))
                .unwrap_err()
                .field,
            "note"
        );
    }
}
