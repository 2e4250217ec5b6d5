//! Pure types shared by the relay and the client: addresses, ids, fingerprints, the message
//! and its sealed envelope, and their limits. No I/O, no keys.

mod address;
pub mod b64;
mod consent;
mod discovery;
mod envelope;
mod error;
mod fingerprint;
mod frames;
mod group;
mod ids;
mod importance;
mod invite;
mod keys;
mod limits;
mod link;
mod message;
mod owner;
mod receipt;
mod reservation;
mod rotation;
mod shown;
mod voice;

pub use address::{Address, AgentName, MAX_NAME_LEN, MAX_STORED_NAME_BYTES, Peer, RelayName};
pub use consent::{ConsentEvent, MAX_NOTE_CHARS, Policy, RequestCode, RequestView, validate_note};
pub use discovery::{
    AgentKeys, EndpointPath, MAX_DISCOVERY_BYTES, RelayEndpoint, RelayInfo, RelayKey,
    WEBSOCKET_PATH, WELL_KNOWN_PATH, agent_keys_payload,
};
pub use envelope::{ENVELOPE_VERSION, EnvelopeHead, KeyWrap, KeyWrapHead, SealedEnvelope};
pub use error::ValidationError;
pub use fingerprint::{FINGERPRINT_BYTES, Fingerprint};
pub use frames::{
    Bounce, ClientFrame, CopyFate, CopyKey, CopyState, DirectoryEntry, ErrorCode, FRAME_OVERHEAD,
    MAX_BOUNCES, MAX_COPY_CHECKS, MAX_DESCRIPTION_CHARS, MAX_PRESENCE_AGENTS, MAX_REF_CHARS,
    Online, PROTOCOL_VERSION, Seq, ServerFrame, hello_payload, register_payload, retire_payload,
};
pub use group::{
    GroupPolicy, GroupView, MAX_GROUP_MEMBERS, MAX_GROUPS_LISTED, MAX_GROUPS_PER_CREATOR,
};
pub use ids::{MemoryId, MessageId, ReservationId, ThreadId};
pub use importance::Importance;
pub use invite::InviteToken;
pub use keys::PublicKeys;
pub use limits::Limits;
pub use link::{
    Deliver, LINK_PATH, LINK_VERSION, LINK_WINDOW, LinkAnswer, LinkRequest, MAX_LINK_BOUNCES,
    Refusal, RemoteBounce, deliver_frame, group_copy, link_deliver_frame, link_payload,
    read_link_copy,
};
pub use message::{Attachment, Message, now_millis};
pub use owner::{OwnerAct, OwnerKey, owner_payload};
pub use receipt::{MAX_ANSWER_CHARS, Receipt, ReceiptKind, validate_answer};
pub use reservation::{
    DEFAULT_TTL_SECS, MAX_HELD_PER_PROJECT, MAX_PATTERN_CHARS, MAX_PATTERNS, MAX_PROJECT_CHARS,
    MAX_PROJECT_RESERVATIONS, MAX_REASON_CHARS, MAX_TTL_SECS, MIN_TTL_SECS, PathMatcher, Pattern,
    ProjectName, Reason, Reservation, ReservationMode, ReservationRequest, Ttl, Waiting,
    validate_patterns,
};
pub use rotation::{KeyRotation, MAX_ROTATIONS, rotation_payload};
pub use shown::{HIDDEN_QUERY, Shown};
pub use voice::{owner_message, voice_payload};
