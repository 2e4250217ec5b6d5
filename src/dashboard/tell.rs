//! The owner writing to their agent from the page: the form on the agent's inbox page (a
//! subject, the message, the one passphrase field), read like the consent form (`form.rs`:
//! one wiped buffer, each value decoded into a wiped buffer of its own, the passphrase moved
//! into `Passphrase`), then signed with the owner key it unlocks and stored by
//! `Mailbox::tell`, exactly as `mailslot tell` does. Answered `303 See Other` to the inbox
//! page (Post/Redirect/Get).

use axum::body::Body;

use super::form::{self, FormError, Secret};
use crate::crypto::{Owner, OwnerKeyError};
use crate::keys::{OwnerPinError, read_owner_public};
use crate::mailbox::{Mailbox, MailboxError};
use crate::protocol::{MessageId, ValidationError};

/// The largest form accepted: the longest message, every byte percent-encoded (three bytes
/// each), and room for the other fields.
pub const MAX_TELL_FORM_BYTES: usize = 3 * (64 * 1024) + 8 * 1024;

/// Why the owner's message from the page was not stored.
#[derive(Debug, thiserror::Error)]
pub enum TellError {
    /// The form is missing a field or has a bad one.
    #[error(transparent)]
    Form(#[from] FormError),
    /// A field's value is invalid (the message, the subject, the passphrase).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The home has no owner key yet.
    #[error(
        "your messages to your agents are signed with your owner key, and this home has none yet: run `mailslot owner init` once at a terminal, then try again"
    )]
    NoOwnerKey,
    /// The owner key file is not the one this home confirmed.
    #[error(transparent)]
    KeyFile(#[from] OwnerPinError),
    /// The owner key could not be unlocked (a wrong passphrase, most often).
    #[error(transparent)]
    Unlock(#[from] OwnerKeyError),
    /// The store refused it.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
}

/// The posted form.
pub struct TellForm {
    /// The page's CSRF token.
    pub csrf: String,
    /// One line; empty: the message's first line.
    pub subject: String,
    /// The message.
    pub body: String,
    /// The owner's passphrase.
    pub passphrase: Secret,
}

/// Reads and parses the form in `body` (at most [`MAX_TELL_FORM_BYTES`]).
pub async fn read_form(body: Body) -> Result<TellForm, FormError> {
    TellForm::parse(&form::read_body(body, MAX_TELL_FORM_BYTES).await?)
}

impl TellForm {
    /// Parses an `application/x-www-form-urlencoded` body: `csrf`, `subject`, `body` and
    /// `passphrase`, each once; unknown fields are ignored.
    pub fn parse(raw: &[u8]) -> Result<Self, FormError> {
        let (mut csrf, mut subject, mut body, mut passphrase) = (None, None, None, None);
        for pair in raw.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
            let (key, value) = match pair.iter().position(|b| *b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &[][..]),
            };
            let key = form::decode(key)?;
            let slot = match key.as_str() {
                "csrf" => &mut csrf,
                "subject" => &mut subject,
                "body" => &mut body,
                "passphrase" => &mut passphrase,
                _ => continue,
            };
            if slot.replace(form::decode(value)?).is_some() {
                return Err(FormError::Bad(format!(
                    "the field {:?} is there twice",
                    &*key
                )));
            }
        }
        let missing = |name: &str| FormError::Bad(format!("the field {name:?} is missing"));
        // A browser sends a textarea's line breaks as CR LF.
        let body = body.ok_or_else(|| missing("body"))?.replace("\r\n", "\n");
        Ok(Self {
            csrf: csrf.ok_or_else(|| missing("csrf"))?.to_string(),
            subject: subject.map(|s| s.trim().to_owned()).unwrap_or_default(),
            body,
            passphrase: Secret(passphrase.ok_or_else(|| missing("passphrase"))?),
        })
    }
}

/// Signs `form`'s message with the owner key at `owner_key`, unlocked by the form's
/// passphrase, and stores it for `mailbox`'s agent; its id.
pub async fn tell(
    mailbox: &Mailbox,
    owner_key: &std::path::Path,
    form: TellForm,
) -> Result<MessageId, TellError> {
    let subject = (!form.subject.is_empty()).then_some(form.subject.as_str());
    // Checked before the unlock: a mistake should not cost an Argon2 run.
    crate::protocol::owner_message(mailbox.name(), subject, &form.body)?;
    if read_owner_public(owner_key)?.is_none() {
        return Err(TellError::NoOwnerKey);
    }
    let passphrase = form.passphrase.into_passphrase()?;
    let path = owner_key.to_owned();
    // Argon2id takes a while: off the async threads.
    let signer = tokio::task::spawn_blocking(move || Owner::unlock(&path, &passphrase))
        .await
        .expect("unlocking never panics")?;
    Ok(mailbox.tell(&signer, subject, &form.body).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_decoded_and_line_breaks_made_plain() {
        let form = TellForm::parse(
            b"csrf=x&subject=+Deploy+&body=Stop+it.%0D%0AThen+report.&passphrase=a+b&other=1",
        )
        .unwrap();
        assert_eq!(form.subject, "Deploy");
        assert_eq!(form.body, "Stop it.\nThen report.");
        assert_eq!(&*form.passphrase.0, "a b");
        let twice = TellForm::parse(b"csrf=x&body=a&body=b&passphrase=p")
            .err()
            .unwrap();
        assert!(twice.to_string().contains("twice"), "{twice}");
        let missing = TellForm::parse(b"csrf=x&passphrase=p").err().unwrap();
        assert!(missing.to_string().contains("body"), "{missing}");
    }

    #[tokio::test]
    async fn a_form_over_the_limit_is_refused() {
        let big = Body::from(vec![b'a'; MAX_TELL_FORM_BYTES + 1]);
        let refused = read_form(big).await.err().unwrap();
        assert!(refused.to_string().contains("larger than"), "{refused}");
    }
}
