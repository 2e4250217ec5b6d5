//! The home's agents as the dashboard runs them: scanned again on every page that lists them,
//! so an agent made after the dashboard started appears without a restart; each mailbox is
//! opened the first time it is needed, and stays open until the dashboard stops.

use std::collections::BTreeMap;

use tokio::sync::Mutex;

use crate::agent::{Agent, AgentError};
use crate::client::RelayUrl;
use crate::config::Paths;
use crate::mailbox::{Mailbox, MailboxError};
use crate::protocol::{AgentName, RelayName};

/// Why the agents could not be listed or opened.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    /// The home's agents could not be listed.
    #[error("cannot list the agents in {home}: {source}")]
    List {
        /// The home folder.
        home: std::path::PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// An agent could not be opened.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// An agent's mailbox could not start.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
}

/// The agents, opened as they are needed.
pub struct Agents {
    paths: Paths,
    relay: RelayUrl,
    trusted: Vec<RelayName>,
    open: Mutex<BTreeMap<AgentName, Mailbox>>,
}

impl Agents {
    /// The agents of `paths`' home, none open yet.
    pub fn new(paths: Paths, relay: RelayUrl, trusted: Vec<RelayName>) -> Self {
        Self {
            paths,
            relay,
            trusted,
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every agent of the home now, by name, each opened if it was not yet.
    pub async fn all(&self) -> Result<Vec<(AgentName, Mailbox)>, AgentsError> {
        let names = self.names()?;
        let mut open = self.open.lock().await;
        let mut all = Vec::with_capacity(names.len());
        for name in names {
            let mailbox = self.opened(&mut open, &name).await?;
            all.push((name, mailbox));
        }
        Ok(all)
    }

    /// The agent named `name`, opened if it was not yet; `None` when the home has none.
    pub async fn get(&self, name: &AgentName) -> Result<Option<Mailbox>, AgentsError> {
        let mut open = self.open.lock().await;
        if let Some(mailbox) = open.get(name) {
            return Ok(Some(mailbox.clone()));
        }
        if !self.names()?.contains(name) {
            return Ok(None);
        }
        Ok(Some(self.opened(&mut open, name).await?))
    }

    /// Closes every mailbox opened.
    pub async fn close(&self) {
        for mailbox in std::mem::take(&mut *self.open.lock().await).into_values() {
            mailbox.close().await;
        }
    }

    fn names(&self) -> Result<Vec<AgentName>, AgentsError> {
        self.paths
            .agent_names()
            .map_err(|source| AgentsError::List {
                home: self.paths.home().to_owned(),
                source,
            })
    }

    async fn opened(
        &self,
        open: &mut BTreeMap<AgentName, Mailbox>,
        name: &AgentName,
    ) -> Result<Mailbox, AgentsError> {
        if let Some(mailbox) = open.get(name) {
            return Ok(mailbox.clone());
        }
        let (agent, _) = Agent::open_or_create(&self.paths, name)?;
        let mailbox = Mailbox::open_window(agent, self.relay.clone(), self.trusted.clone()).await?;
        open.insert(name.clone(), mailbox.clone());
        Ok(mailbox)
    }
}
