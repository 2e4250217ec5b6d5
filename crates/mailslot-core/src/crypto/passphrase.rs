//! A passphrase as the owner typed it: bounded, never shown, wiped from memory when dropped.
//! Only the key stretching in this module's siblings (`owner`, `vault`) reads it.

use std::fmt;

use zeroize::Zeroizing;

use crate::protocol::ValidationError;

/// The shortest passphrase accepted: the sealed file may be read by an agent, which can then
/// guess offline, so a short one would be found.
pub const MIN_PASSPHRASE_CHARS: usize = 10;
/// The longest passphrase accepted.
const MAX_PASSPHRASE_CHARS: usize = 1024;

/// A passphrase as the owner typed it; wiped from memory when dropped.
pub struct Passphrase(Zeroizing<String>);

impl Passphrase {
    /// Checks the length: at least [`MIN_PASSPHRASE_CHARS`] characters.
    pub fn new(text: String) -> Result<Self, ValidationError> {
        let text = Zeroizing::new(text);
        let chars = text.chars().count();
        if chars < MIN_PASSPHRASE_CHARS {
            return Err(ValidationError::new(
                "passphrase",
                format!(
                    "is {chars} characters; use at least {MIN_PASSPHRASE_CHARS} (a few words are easy to type and hard to guess)"
                ),
            ));
        }
        if chars > MAX_PASSPHRASE_CHARS {
            return Err(ValidationError::too_long(
                "passphrase",
                chars,
                MAX_PASSPHRASE_CHARS,
                "characters",
            ));
        }
        Ok(Self(text))
    }
}

impl Passphrase {
    /// The text, for the key stretching in this module's siblings only.
    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase(…)")
    }
}
