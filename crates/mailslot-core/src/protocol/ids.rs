//! Identifiers: UUIDv7, so they sort by creation time and double as idempotency keys.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Address, ValidationError};

macro_rules! uuid_v7_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh id for now.
            #[allow(clippy::new_without_default)]
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Parses the hyphenated lowercase form of a UUIDv7.
            pub fn parse(s: &str) -> Result<Self, ValidationError> {
                let uuid = Uuid::try_parse(s)
                    .ok()
                    .filter(|u| u.get_version_num() == 7 && u.hyphenated().to_string() == s)
                    .ok_or_else(|| {
                        ValidationError::new(
                            $field,
                            format!("{:?} is not a lowercase hyphenated UUIDv7 (like 019a5f3c-7b2e-7c41-9d3e-2f1a0b9c8d7e)", truncate(s)),
                        )
                    })?;
                Ok(Self(uuid))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.to_string()
            }
        }
    };
}

/// Keeps error messages short when the bad value is huge.
fn truncate(s: &str) -> String {
    s.chars().take(48).collect()
}

uuid_v7_id!(
    /// A message's id, chosen by its sender; the relay and the store deduplicate by it.
    MessageId,
    "message id"
);
impl MessageId {
    /// The id the copy of this message for `to` on another relay is kept under in the sending
    /// relay's mailbox for that relay: every recipient there gets a copy of its own, and a
    /// re-send of the same copy gets the same id. Still a UUIDv7 with the message's time
    /// (its first 48 bits); the rest is SHA-256 of the message id and the address.
    pub fn relay_copy(&self, to: &Address) -> MessageId {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(b"mailslot/v1/relay-copy\0");
        hash.update(self.0.as_bytes());
        hash.update(to.to_string().as_bytes());
        let digest = hash.finalize();
        let mut bytes = [0u8; 16];
        bytes[..6].copy_from_slice(&self.0.as_bytes()[..6]);
        bytes[6..].copy_from_slice(&digest[..10]);
        bytes[6] = 0x70 | (bytes[6] & 0x0f);
        bytes[8] = 0x80 | (bytes[8] & 0x3f);
        MessageId(Uuid::from_bytes(bytes))
    }
}

uuid_v7_id!(
    /// A conversation's id: the first message's thread, carried by every reply.
    ThreadId,
    "thread id"
);
uuid_v7_id!(
    /// A memory's id in the agent's own store.
    MemoryId,
    "memory id"
);
uuid_v7_id!(
    /// A file reservation's id, chosen by the relay that keeps it.
    ReservationId,
    "reservation id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_reject_other_uuids() {
        let id = MessageId::new();
        assert_eq!(MessageId::parse(&id.to_string()).unwrap(), id);
        let v4 = "9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f";
        assert_eq!(MessageId::parse(v4).unwrap_err().field, "message id");
        assert!(MessageId::parse(&id.to_string().to_uppercase()).is_err());
        assert!(ThreadId::parse("not-a-uuid").is_err());
    }
}
