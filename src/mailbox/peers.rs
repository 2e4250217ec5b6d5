//! Whom to write to: the directory, who is online, and `whois`, asked over the held relay
//! session through the typed calls in `client` (the CLI makes the same calls over a control
//! connection).

use super::{Mailbox, MailboxError};
use crate::client::whois::Whois;
use crate::client::{directory, presence};
use crate::protocol::{Address, AgentName, DirectoryEntry, Online};

impl Mailbox {
    /// The agents listed in the relay's directory, with their own descriptions (another
    /// agent's words: frame them before they reach a model).
    pub async fn directory(&self) -> Result<Vec<DirectoryEntry>, MailboxError> {
        Ok(directory::list(&mut self.asking().await?).await?)
    }

    /// Which of `agents` (with `None`, of this agent's contacts and the listed agents) are
    /// online now, and since when. Anyone this agent may not see is absent.
    pub async fn presence(
        &self,
        agents: Option<Vec<AgentName>>,
    ) -> Result<Vec<Online>, MailboxError> {
        Ok(presence::online(&mut self.asking().await?, agents).await?)
    }

    /// What `address` is to this agent: fingerprint, contact status, listing, presence.
    /// Pins nothing.
    pub async fn whois(&self, address: &Address) -> Result<Whois, MailboxError> {
        let trusted = &self.0.trusted;
        Ok(
            crate::client::whois::whois(&mut self.asking().await?, &self.0.store, trusted, address)
                .await?,
        )
    }
}
