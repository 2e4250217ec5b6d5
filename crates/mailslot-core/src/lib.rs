//! What both sides of mailslot speak: the agent's and the relay's. From the bottom:
//! [`protocol`] (pure types), [`crypto`] (keys, signing, sealing; no I/O), [`keys`] (the key
//! files on disk), and the two pieces of I/O policy every outgoing connection shares, [`tls`]
//! (the client settings) and [`fetch`] (reading an HTTP answer within a bound).
#![cfg(unix)]

pub mod crypto;
pub mod fetch;
pub mod keys;
pub mod protocol;
pub mod tls;
