//! Size limits on messages. Relays may configure their own; these are the defaults.

use serde::{Deserialize, Serialize};

/// Every bound a message must respect. All sizes are in bytes unless named `_chars`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Subject length in characters.
    pub subject_chars: usize,
    /// Body size.
    pub body_bytes: usize,
    /// Recipients in to + cc + bcc together.
    pub recipients: usize,
    /// The `data` JSON, serialized.
    pub data_bytes: usize,
    /// The `context` JSON, serialized.
    pub context_bytes: usize,
    /// Number of attachments.
    pub attachments: usize,
    /// Attachment file name length in characters.
    pub attachment_name_chars: usize,
    /// Attachment media type length in characters.
    pub media_type_chars: usize,
    /// One attachment's content.
    pub attachment_bytes: usize,
    /// The content of all of a message's attachments together.
    pub attachments_bytes: usize,
    /// A whole sealed envelope as it travels, serialized.
    pub envelope_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            subject_chars: 256,
            body_bytes: 64 * 1024,
            recipients: 32,
            data_bytes: 16 * 1024,
            context_bytes: 16 * 1024,
            attachments: 8,
            attachment_name_chars: 255,
            media_type_chars: 127,
            attachment_bytes: 8 * 1024 * 1024,
            attachments_bytes: 8 * 1024 * 1024,
            // Room for 8 MiB of attachments: base64 in the signed JSON (4/3), sealed and base64
            // again in the envelope (4/3), with the body, data and context at their limits
            // and a key wrap per recipient (docs/decisions.md, "Attachments").
            envelope_bytes: 16 * 1024 * 1024,
        }
    }
}
