//! The consent form as posted, read so that the owner's passphrase leaves no copy behind. The
//! body is gathered into one zeroizing buffer, reserved whole up front so that it never moves
//! (a moved buffer leaves its old bytes in freed memory); each frame that no one else holds
//! is wiped once copied. The form is decoded by hand, each value straight into a zeroizing
//! buffer of its own, because a general decoder makes intermediate copies it frees unwiped
//! (`form_urlencoded` copies a value to turn `+` into spaces, then again to undo `%XX`). The
//! passphrase moves from there into [`Passphrase`] without another copy.

use axum::body::Body;
use futures_util::StreamExt;
use zeroize::{Zeroize, Zeroizing};

use crate::crypto::Passphrase;
use crate::protocol::{Address, ValidationError};

/// Why a consent form cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FormError {
    /// A field is missing or malformed.
    #[error("the form is not valid: {0}; reload the page and try again")]
    Bad(String),
    /// A field's value is invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

/// The largest form accepted (bytes).
pub const MAX_FORM_BYTES: usize = 8 * 1024;

/// What the owner asked for: the button pressed, `ACTION AGENT` (or `policy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Approve a request with its code.
    Approve(Address),
    /// Deny a request.
    Deny(Address),
    /// Block an agent.
    Block(Address),
    /// Lift a block.
    Unblock(Address),
    /// End a contact.
    Remove(Address),
    /// Join a group: accept the mail it fans out to this agent.
    Join(Address),
    /// Set the policy chosen in the form's `policy` field.
    Policy,
}

impl Action {
    fn parse(value: &str) -> Result<Self, FormError> {
        if value == "policy" {
            return Ok(Self::Policy);
        }
        let (verb, agent) = value.split_once(' ').ok_or_else(|| {
            FormError::Bad(format!(
                "action {value:?} is not `ACTION AGENT` (approve, deny, block, unblock, remove or join) or `policy`"
            ))
        })?;
        let agent = Address::parse(agent)?;
        Ok(match verb {
            "approve" => Self::Approve(agent),
            "deny" => Self::Deny(agent),
            "block" => Self::Block(agent),
            "unblock" => Self::Unblock(agent),
            "remove" => Self::Remove(agent),
            "join" => Self::Join(agent),
            other => {
                return Err(FormError::Bad(format!(
                    "action {other:?} is none of approve, deny, block, unblock, remove, join, policy"
                )));
            }
        })
    }

    /// The other agent, if the action has one.
    pub fn agent(&self) -> Option<&Address> {
        match self {
            Self::Approve(a)
            | Self::Deny(a)
            | Self::Block(a)
            | Self::Unblock(a)
            | Self::Remove(a)
            | Self::Join(a) => Some(a),
            Self::Policy => None,
        }
    }
}

/// The name of the field that holds the code of `requester`'s request.
pub fn code_field(requester: &Address) -> String {
    format!("code.{requester}")
}

/// The passphrase field, in a buffer wiped when dropped.
pub struct Secret(pub(super) Zeroizing<String>);

impl Secret {
    /// The owner's passphrase, checked; the text moves, it is not copied.
    pub fn into_passphrase(mut self) -> Result<Passphrase, ValidationError> {
        Passphrase::new(std::mem::take(&mut *self.0))
    }
}

/// The posted form.
pub struct ConsentForm {
    /// The page's CSRF token.
    pub csrf: String,
    /// What to do.
    pub action: Action,
    /// The code typed for the request approved (empty for other actions).
    pub code: String,
    /// The policy chosen (its field is always posted; used by [`Action::Policy`] only).
    pub policy: Option<String>,
    /// The owner's passphrase.
    pub passphrase: Secret,
}

/// Reads and parses the form in `body` (at most [`MAX_FORM_BYTES`]).
pub async fn read_form(body: Body) -> Result<ConsentForm, FormError> {
    ConsentForm::parse(&read_body(body, MAX_FORM_BYTES).await?)
}

/// The whole body, at most `limit` bytes, in one buffer that is wiped when dropped.
pub(super) async fn read_body(body: Body, limit: usize) -> Result<Zeroizing<Vec<u8>>, FormError> {
    let mut buffer = Zeroizing::new(Vec::with_capacity(limit));
    let mut frames = body.into_data_stream();
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|e| FormError::Bad(format!("the body broke off: {e}")))?;
        let fits = buffer.len() + frame.len() <= limit;
        if fits {
            buffer.extend_from_slice(&frame);
        }
        // A frame still shared with hyper's read buffer cannot be wiped here.
        if let Ok(mut owned) = frame.try_into_mut() {
            owned.as_mut().zeroize();
        }
        if !fits {
            return Err(FormError::Bad(format!(
                "the form is larger than {limit} bytes"
            )));
        }
    }
    Ok(buffer)
}

impl ConsentForm {
    /// Parses an `application/x-www-form-urlencoded` body. Every field once; unknown ones are
    /// ignored.
    pub fn parse(body: &[u8]) -> Result<Self, FormError> {
        let (mut csrf, mut action, mut policy, mut passphrase) = (None, None, None, None);
        let mut codes = Vec::new();
        for pair in body.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
            let (key, value) = match pair.iter().position(|b| *b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &[][..]),
            };
            let key = decode(key)?;
            let slot = match key.as_str() {
                "csrf" => &mut csrf,
                "action" => &mut action,
                "policy" => &mut policy,
                "passphrase" => &mut passphrase,
                name if name.starts_with("code.") => {
                    if codes
                        .iter()
                        .any(|(k, _): &(Zeroizing<String>, _)| **k == *name)
                    {
                        return Err(FormError::Bad(format!("the field {name:?} is there twice")));
                    }
                    codes.push((key, decode(value)?));
                    continue;
                }
                _ => continue,
            };
            if slot.replace(decode(value)?).is_some() {
                return Err(FormError::Bad(format!(
                    "the field {:?} is there twice",
                    &*key
                )));
            }
        }
        let missing = |name: &str| FormError::Bad(format!("the field {name:?} is missing"));
        let action = Action::parse(&action.ok_or_else(|| missing("action"))?)?;
        let code = match &action {
            Action::Approve(requester) => {
                let field = code_field(requester);
                codes
                    .iter()
                    .find(|(k, _)| **k == field)
                    .map(|(_, v)| v.to_string())
                    .ok_or_else(|| missing(&field))?
            }
            _ => String::new(),
        };
        Ok(Self {
            csrf: csrf.ok_or_else(|| missing("csrf"))?.to_string(),
            action,
            code,
            policy: policy.map(|p| p.to_string()),
            passphrase: Secret(passphrase.ok_or_else(|| missing("passphrase"))?),
        })
    }
}

/// One form-encoded name or value (`+` is a space, `%XX` a byte), decoded into a buffer of
/// its own that is wiped when dropped, and never grows (so never moves).
pub(super) fn decode(raw: &[u8]) -> Result<Zeroizing<String>, FormError> {
    let mut out = Zeroizing::new(Vec::with_capacity(raw.len()));
    let mut i = 0;
    while i < raw.len() {
        let byte = match raw[i] {
            b'+' => b' ',
            b'%' => match raw.get(i + 1..i + 3).and_then(hex_byte) {
                Some(byte) => {
                    i += 2;
                    byte
                }
                None => b'%',
            },
            byte => byte,
        };
        out.push(byte);
        i += 1;
    }
    match String::from_utf8(std::mem::take(&mut *out)) {
        Ok(text) => Ok(Zeroizing::new(text)),
        Err(e) => {
            e.into_bytes().zeroize();
            Err(FormError::Bad("a field is not UTF-8".into()))
        }
    }
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_decoded_and_checked() {
        let form = ConsentForm::parse(
            b"csrf=x&action=approve+alice&code.carol=WXYZ-WXYZ&code.alice=ABCD-EFGH&policy=open&passphrase=a+b%26c%C3%BC%2&x=1",
        )
        .unwrap();
        assert_eq!(
            form.action,
            Action::Approve(Address::parse("alice").unwrap())
        );
        assert_eq!(form.code, "ABCD-EFGH", "the approved request's own code");
        assert_eq!(form.policy.as_deref(), Some("open"));
        assert_eq!(
            &*form.passphrase.0, "a b&cü%2",
            "a broken escape stays as it is"
        );
        let policy =
            ConsentForm::parse(b"csrf=x&action=policy&policy=closed&passphrase=p").unwrap();
        assert_eq!(policy.action, Action::Policy);
        let launch = ConsentForm::parse(b"csrf=x&action=launch+bob&passphrase=p")
            .err()
            .unwrap();
        assert!(launch.to_string().contains("launch"), "{launch}");
        let twice = ConsentForm::parse(b"csrf=x&action=deny+bob&passphrase=p&passphrase=q")
            .err()
            .unwrap();
        assert!(twice.to_string().contains("twice"), "{twice}");
        let missing = ConsentForm::parse(b"csrf=x&action=deny+bob").err().unwrap();
        assert!(missing.to_string().contains("passphrase"), "{missing}");
        let no_code = ConsentForm::parse(b"csrf=x&action=approve+bob&code.carol=X&passphrase=p")
            .err()
            .unwrap();
        assert!(no_code.to_string().contains("code.bob"), "{no_code}");
        assert!(ConsentForm::parse(b"csrf=x&action=deny+bob&passphrase=%FF").is_err());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        let big = Body::from(vec![b'a'; MAX_FORM_BYTES + 1]);
        let refused = read_form(big).await.err().unwrap();
        assert!(refused.to_string().contains("larger than"), "{refused}");
    }
}
