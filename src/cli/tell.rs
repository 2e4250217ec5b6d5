//! `tell`: the owner writes to their own agent. The message is signed with the owner key,
//! unlocked by the passphrase typed at a terminal exactly as for a consent change
//! (`owner::unlock`), and written straight into the agent's store as received mail: no relay
//! carries it, so it works offline, and a running `mailslot mcp` rings it like any mail, as
//! the owner's words.

use std::io::IsTerminal;

use anyhow::bail;
use serde::Serialize;

use super::body::{self, BodySource};
use super::{Ctx, output, owner};
use crate::agent::voice;
use crate::protocol::MessageId;

#[derive(Serialize)]
struct Told {
    id: MessageId,
    to: String,
}

pub(super) fn tell(ctx: &Ctx, subject: Option<String>, src: BodySource) -> anyhow::Result<()> {
    let name = ctx.agent_name()?;
    // The passphrase is read from the terminal: with the body on stdin, the controlling
    // terminal must be there; otherwise stdin is the terminal, as for `approve`.
    let at_terminal = if src.body.is_none() && src.body_file.is_none() {
        std::fs::File::open("/dev/tty").is_ok()
    } else {
        std::io::stdin().is_terminal()
    };
    if !at_terminal {
        bail!(
            "tell needs its owner at a terminal, for the owner's passphrase: run `{}` yourself in an interactive shell (an agent cannot speak as its owner)",
            output::command(&name, "tell TEXT")
        );
    }
    let mut agent = ctx.open_agent()?;
    let body = body::read(src)?;
    // Checked before the passphrase is asked for: a mistake should not cost the person one.
    crate::protocol::owner_message(&agent.name, subject.as_deref(), &body)?;
    let signer = owner::unlock(ctx)?;
    let (message, signature) = voice::compose(&signer, &agent.name, subject.as_deref(), &body)?;
    agent.store.insert_owner_message(&message, &signature)?;
    let told = Told {
        id: message.id,
        to: agent.name.to_string(),
    };
    output::emit(ctx.json, &told, |t| format!("told {}: {}", t.to, t.id))
}
