//! Invite tokens: what an operator hands out when a relay registers new names by invite only.
//! A token is a secret until it is used; the relay keeps only its digest.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ValidationError;

const PREFIX: &str = "msi_";
const HEX_CHARS: usize = 40;

/// A single-use invite: `msi_` and 40 lowercase hex digits (160 random bits).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct InviteToken(String);

impl InviteToken {
    /// A token from 20 random bytes.
    pub fn from_random(bytes: [u8; 20]) -> Self {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self(format!("{PREFIX}{hex}"))
    }

    /// Parses a token as the operator passed it on (surrounding spaces ignored).
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let s = s.trim();
        let valid = s.strip_prefix(PREFIX).is_some_and(|hex| {
            hex.len() == HEX_CHARS && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        if !valid {
            return Err(ValidationError::new(
                "invite",
                format!(
                    "is not an invite token (`{PREFIX}` and {HEX_CHARS} hex digits); copy it whole from the relay's operator"
                ),
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// The token itself: a secret until it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for InviteToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InviteToken(…)")
    }
}

impl TryFrom<String> for InviteToken {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<InviteToken> for String {
    fn from(t: InviteToken) -> Self {
        t.0
    }
}

impl std::str::FromStr for InviteToken {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_never_show_in_debug() {
        let token = InviteToken::from_random([0xab; 20]);
        assert_eq!(InviteToken::parse(token.expose()).unwrap(), token);
        assert!(!format!("{token:?}").contains("abab"));
        assert!(InviteToken::parse("msi_123").is_err());
        assert!(InviteToken::parse(&token.expose().to_uppercase()).is_err());
    }
}
