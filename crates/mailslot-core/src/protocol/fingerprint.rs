//! Fingerprints: a short digest of an agent's public keys that owners compare aloud.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// Crockford's base32: no I, L, O or U, so nothing is misread when spoken or copied.
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Bytes of digest a fingerprint shows: 120 bits, 24 characters.
pub const FINGERPRINT_BYTES: usize = 15;
const GROUPS: usize = 6;
const GROUP_LEN: usize = 4;

/// Six groups of four base32 characters, like `7KQF-3MZA-X2P9-B4CD-HJ8N-QRST`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Renders the first bytes of a digest; crypto computes the digest.
    pub fn from_digest(digest: &[u8; FINGERPRINT_BYTES]) -> Self {
        let mut chars = String::with_capacity(GROUPS * (GROUP_LEN + 1));
        let mut acc: u32 = 0;
        let mut bits = 0;
        let mut count = 0;
        for &byte in digest {
            acc = (acc << 8) | u32::from(byte);
            bits += 8;
            while bits >= 5 {
                bits -= 5;
                if count > 0 && count % GROUP_LEN == 0 {
                    chars.push('-');
                }
                chars.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
                count += 1;
            }
        }
        Self(chars)
    }

    /// Parses the display form (case-insensitive; dashes required).
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let upper = s.to_ascii_uppercase();
        let groups: Vec<&str> = upper.split('-').collect();
        let ok = groups.len() == GROUPS
            && groups
                .iter()
                .all(|g| g.len() == GROUP_LEN && g.bytes().all(|b| ALPHABET.contains(&b)));
        if !ok {
            return Err(ValidationError::new(
                "fingerprint",
                format!(
                    "{:?} is not six dash-separated groups of four base32 characters",
                    s.chars().take(40).collect::<String>()
                ),
            ));
        }
        Ok(Self(upper))
    }

    /// The display form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Fingerprint {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Fingerprint> for String {
    fn from(f: Fingerprint) -> Self {
        f.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_parses() {
        let fp = Fingerprint::from_digest(&[0u8; FINGERPRINT_BYTES]);
        assert_eq!(fp.as_str(), "0000-0000-0000-0000-0000-0000");
        let fp = Fingerprint::from_digest(&[0xff; FINGERPRINT_BYTES]);
        assert_eq!(fp.as_str(), "ZZZZ-ZZZZ-ZZZZ-ZZZZ-ZZZZ-ZZZZ");
        assert_eq!(Fingerprint::parse(&fp.as_str().to_lowercase()).unwrap(), fp);
        assert!(Fingerprint::parse("ZZZZ-ZZZZ").is_err());
        assert!(Fingerprint::parse("ZZZU-ZZZZ-ZZZZ-ZZZZ-ZZZZ-ZZZZ").is_err());
    }
}
