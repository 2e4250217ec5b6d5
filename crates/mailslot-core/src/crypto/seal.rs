//! End-to-end sealing. The signed letter is encrypted once with XChaCha20-Poly1305 under a
//! random content key; that key is wrapped for each recipient with HPKE (RFC 9180, base mode,
//! X25519-HKDF-SHA256, ChaCha20-Poly1305). Each BCC recipient gets a copy of its own, signed
//! separately, whose letter names only that recipient in `bcc`.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hpke::aead::ChaCha20Poly1305 as HpkeChaCha;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use zeroize::Zeroizing;

use super::sign::{self, Domain, VerifyError};
use super::{Identity, PublicIdentity};
use crate::protocol::{
    Address, ENVELOPE_VERSION, KeyWrap, Limits, Message, SealedEnvelope, ValidationError,
};

const KEY_WRAP_INFO: &[u8] = b"mailslot/v1/key-wrap";
const NONCE_LEN: usize = 24;
const CONTENT_KEY_LEN: usize = 32;

type EncappedKey = <X25519HkdfSha256 as Kem>::EncappedKey;

/// Why a message could not be sealed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SealError {
    /// The message breaks a limit.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A recipient's public keys were not supplied.
    #[error("no public keys known for {0}; look them up on the relay first")]
    MissingKey(Address),
}

/// Why an envelope could not be opened. None of these are shown as mail.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpenError {
    /// The envelope carries no key for this recipient.
    #[error("the envelope has no key for {0}")]
    NotForMe(Address),
    /// The envelope's format is wrong.
    #[error("malformed envelope: {0}")]
    Malformed(String),
    /// Decryption failed: altered in transit or sealed to other keys.
    #[error("the envelope does not decrypt: it was altered or sealed to other keys")]
    Decrypt,
    /// The letter's signature is not the claimed sender's.
    #[error(transparent)]
    Signature(#[from] VerifyError),
    /// The letter breaks a limit.
    #[error("the letter is invalid: {0}")]
    Invalid(ValidationError),
    /// The readable routing fields disagree with the signed letter.
    #[error("the envelope's {0} differs from the signed letter's: it was tampered with")]
    Mismatch(&'static str),
    /// The signed letter does not name this recipient: someone forwarded another's mail.
    #[error("the signed letter is not addressed to {0}: it was forwarded by someone else")]
    NotAddressed(Address),
}

fn content_aad(id: &impl std::fmt::Display, from: &Address, sent_at: &jiff::Timestamp) -> Vec<u8> {
    format!("mailslot/v1/content\0{id}\0{from}\0{sent_at}").into_bytes()
}

fn wrap_aad(id: &impl std::fmt::Display, to: &Address) -> Vec<u8> {
    format!("mailslot/v1/key\0{id}\0{to}").into_bytes()
}

fn random<const N: usize>() -> Zeroizing<[u8; N]> {
    let mut b = Zeroizing::new([0u8; N]);
    getrandom::fill(b.as_mut()).expect("the OS random number generator is unavailable");
    b
}

/// Seals `message` for all its recipients. Returns one envelope for the to and cc recipients
/// (if any), then one per BCC recipient. `keys` must hold every recipient's public keys.
pub fn seal(
    message: &Message,
    sender: &Identity,
    keys: &[(Address, PublicIdentity)],
    limits: &Limits,
) -> Result<Vec<SealedEnvelope>, SealError> {
    message.validate(limits)?;
    let key_of = |addr: &Address| {
        keys.iter()
            .find(|(a, _)| a == addr)
            .map(|(_, k)| k)
            .ok_or_else(|| SealError::MissingKey(addr.clone()))
    };
    let mut copies = Vec::with_capacity(1 + message.bcc.len());
    let visible: Vec<&Address> = message.to.iter().chain(&message.cc).collect();
    let mut letter = message.clone();
    letter.bcc.clear();
    if !visible.is_empty() {
        let recipients = visible
            .into_iter()
            .map(|a| Ok((a, key_of(a)?)))
            .collect::<Result<Vec<_>, SealError>>()?;
        copies.push(seal_copy(&letter, sender, &recipients, limits)?);
    }
    for b in &message.bcc {
        letter.bcc = vec![b.clone()];
        copies.push(seal_copy(&letter, sender, &[(b, key_of(b)?)], limits)?);
    }
    Ok(copies)
}

/// Seals `letter` once for a group's members: the content encrypted once, the key wrapped for
/// each of `members` (a group's roster but the sender, with their keys), though the letter
/// names only the group. The group's relay stores a copy per member with only its wrap.
pub fn seal_for_group(
    letter: &Message,
    sender: &Identity,
    members: &[(Address, PublicIdentity)],
    limits: &Limits,
) -> Result<SealedEnvelope, SealError> {
    letter.validate(limits)?;
    let recipients: Vec<(&Address, &PublicIdentity)> =
        members.iter().map(|(a, k)| (a, k)).collect();
    seal_copy(letter, sender, &recipients, limits)
}

fn seal_copy(
    letter: &Message,
    sender: &Identity,
    recipients: &[(&Address, &PublicIdentity)],
    limits: &Limits,
) -> Result<SealedEnvelope, SealError> {
    let json = serde_json::to_vec(letter).expect("a message always serializes");
    let signed = Zeroizing::new(sign::sign(sender, Domain::Letter, &json));
    let envelope = encrypt_signed(&signed, letter, recipients);
    let size = envelope.to_bytes().len();
    if size > limits.envelope_bytes {
        return Err(ValidationError::too_long(
            "envelope",
            size,
            limits.envelope_bytes,
            "bytes sealed",
        )
        .into());
    }
    Ok(envelope)
}

/// Encrypts signed letter bytes under a fresh content key wrapped for each recipient; the
/// routing header is copied from `letter`.
fn encrypt_signed(
    signed: &[u8],
    letter: &Message,
    recipients: &[(&Address, &PublicIdentity)],
) -> SealedEnvelope {
    let content_key = random::<CONTENT_KEY_LEN>();
    let nonce = random::<NONCE_LEN>();
    let cipher = XChaCha20Poly1305::new(&(*content_key).into());
    let aad = content_aad(&letter.id, &letter.from, &letter.sent_at);
    let ciphertext = cipher
        .encrypt(
            &XNonce::from(*nonce),
            Payload {
                msg: signed,
                aad: &aad,
            },
        )
        .expect("encryption of an in-memory buffer cannot fail");
    let keys = recipients
        .iter()
        .map(|(to, public)| {
            let (enc, key) = hpke::single_shot_seal::<HpkeChaCha, HkdfSha256, X25519HkdfSha256>(
                &OpModeS::Base,
                public.sealing_key(),
                KEY_WRAP_INFO,
                content_key.as_ref(),
                &wrap_aad(&letter.id, to),
            )
            .expect("HPKE sealing to a valid public key cannot fail");
            KeyWrap {
                to: (*to).clone(),
                enc: enc.to_bytes().to_vec(),
                key,
            }
        })
        .collect();
    SealedEnvelope {
        v: ENVELOPE_VERSION,
        id: letter.id,
        from: letter.from.clone(),
        sent_at: letter.sent_at,
        nonce: nonce.to_vec(),
        ciphertext,
        keys,
    }
}

/// Opens an envelope addressed to `me`, verifying it was signed by `sender` (the keys the
/// caller holds for `envelope.from`) and that the readable fields match the signed ones.
pub fn open(
    envelope: &SealedEnvelope,
    me: &Address,
    identity: &Identity,
    sender: &PublicIdentity,
    limits: &Limits,
) -> Result<Message, OpenError> {
    open_as_member(envelope, (me, &[]), identity, sender, limits)
}

/// [`open`] that also takes a letter addressed to one of `groups` alone (the groups `me`
/// joined, as the letter may spell them): group mail names the group, never its members.
pub fn open_as_member(
    envelope: &SealedEnvelope,
    (me, groups): (&Address, &[Address]),
    identity: &Identity,
    sender: &PublicIdentity,
    limits: &Limits,
) -> Result<Message, OpenError> {
    if envelope.v != ENVELOPE_VERSION {
        return Err(OpenError::Malformed(format!(
            "version {} is not {ENVELOPE_VERSION}",
            envelope.v
        )));
    }
    let nonce: [u8; NONCE_LEN] = envelope.nonce.as_slice().try_into().map_err(|_| {
        OpenError::Malformed(format!(
            "nonce is {} bytes, not {NONCE_LEN}",
            envelope.nonce.len()
        ))
    })?;
    let wrap = envelope
        .keys
        .iter()
        .find(|k| &k.to == me)
        .ok_or_else(|| OpenError::NotForMe(me.clone()))?;
    let enc = EncappedKey::from_bytes(&wrap.enc).map_err(|_| OpenError::Decrypt)?;
    // Mail sealed before a rotation reached the sender opens with the key it replaced.
    let content_key = Zeroizing::new(
        identity
            .sealing_keys()
            .find_map(|key| {
                hpke::single_shot_open::<HpkeChaCha, HkdfSha256, X25519HkdfSha256>(
                    &OpModeR::Base,
                    key,
                    &enc,
                    KEY_WRAP_INFO,
                    &wrap.key,
                    &wrap_aad(&envelope.id, me),
                )
                .ok()
            })
            .ok_or(OpenError::Decrypt)?,
    );
    let content_key: [u8; CONTENT_KEY_LEN] = content_key
        .as_slice()
        .try_into()
        .map_err(|_| OpenError::Decrypt)?;
    let cipher = XChaCha20Poly1305::new(&content_key.into());
    let aad = content_aad(&envelope.id, &envelope.from, &envelope.sent_at);
    let signed = Zeroizing::new(
        cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &envelope.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| OpenError::Decrypt)?,
    );
    let json = sign::verify(sender, Domain::Letter, &signed)?;
    let message: Message =
        serde_json::from_slice(json).map_err(|e| OpenError::Malformed(format!("letter: {e}")))?;
    message.validate(limits).map_err(OpenError::Invalid)?;
    if message.id != envelope.id {
        return Err(OpenError::Mismatch("id"));
    }
    if message.from != envelope.from {
        return Err(OpenError::Mismatch("from"));
    }
    if message.sent_at != envelope.sent_at {
        return Err(OpenError::Mismatch("sent_at"));
    }
    let visible = message.to.iter().chain(&message.cc).any(|a| a == me);
    let blind = message.bcc.as_slice() == std::slice::from_ref(me);
    let group = matches!(message.to.as_slice(), [to] if groups.contains(to))
        && message.cc.is_empty()
        && message.bcc.is_empty();
    if !(visible && message.bcc.is_empty() || blind || group) {
        return Err(OpenError::NotAddressed(me.clone()));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::AgentName;

    fn addr(name: &str) -> Address {
        Address::local(AgentName::new(name).unwrap())
    }

    #[test]
    fn a_forwarded_letter_is_refused() {
        let (alice, bob, carol) = (
            Identity::generate(),
            Identity::generate(),
            Identity::generate(),
        );
        let letter = Message::new(addr("alice"), vec![addr("bob")], "for bob only", "the plan");
        let limits = Limits::default();
        let to_bob = seal(
            &letter,
            &alice,
            &[(addr("bob"), bob.public().clone())],
            &limits,
        )
        .unwrap()
        .remove(0);
        // Bob opens it, keeps alice's signed bytes, and re-encrypts them to carol.
        let wrap = &to_bob.keys[0];
        let key = hpke::single_shot_open::<HpkeChaCha, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            bob.sealing_keys().next().unwrap(),
            &EncappedKey::from_bytes(&wrap.enc).unwrap(),
            KEY_WRAP_INFO,
            &wrap.key,
            &wrap_aad(&to_bob.id, &addr("bob")),
        )
        .unwrap();
        let key: [u8; CONTENT_KEY_LEN] = key.as_slice().try_into().unwrap();
        let signed = XChaCha20Poly1305::new(&key.into())
            .decrypt(
                &XNonce::from(<[u8; NONCE_LEN]>::try_from(to_bob.nonce.as_slice()).unwrap()),
                Payload {
                    msg: &to_bob.ciphertext,
                    aad: &content_aad(&to_bob.id, &to_bob.from, &to_bob.sent_at),
                },
            )
            .unwrap();
        let carol_addr = addr("carol");
        let forwarded = encrypt_signed(&signed, &letter, &[(&carol_addr, carol.public())]);
        assert_eq!(
            open(&forwarded, &carol_addr, &carol, alice.public(), &limits),
            Err(OpenError::NotAddressed(carol_addr.clone()))
        );
    }

    #[test]
    fn group_mail_opens_only_for_a_member_of_the_group_it_names() {
        let (alice, bob) = (Identity::generate(), Identity::generate());
        let letter = Message::new(addr("alice"), vec![addr("team")], "to all", "the plan");
        let limits = Limits::default();
        let sealed = seal_for_group(
            &letter,
            &alice,
            &[(addr("bob"), bob.public().clone())],
            &limits,
        )
        .unwrap();
        assert_eq!(
            sealed.keys.len(),
            1,
            "one wrap per member, none for the group"
        );
        let bob_addr = addr("bob");
        assert_eq!(
            open(&sealed, &bob_addr, &bob, alice.public(), &limits),
            Err(OpenError::NotAddressed(bob_addr.clone())),
            "not without having joined"
        );
        let opened = open_as_member(
            &sealed,
            (&bob_addr, &[addr("team")]),
            &bob,
            alice.public(),
            &limits,
        )
        .unwrap();
        assert_eq!(opened.to, [addr("team")]);
        assert!(
            open_as_member(
                &sealed,
                (&bob_addr, &[addr("other")]),
                &bob,
                alice.public(),
                &limits
            )
            .is_err()
        );
    }
}
