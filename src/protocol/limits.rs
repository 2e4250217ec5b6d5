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
            envelope_bytes: 256 * 1024,
        }
    }
}
