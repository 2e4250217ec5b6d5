//! File reservations, asked over the held relay session through the typed calls in
//! `client` (the CLI and `mailslot guard` make the same calls over a control connection).

use super::{Mailbox, MailboxError};
use crate::client::reservations::{self, Release, Reserved};
use crate::protocol::{ProjectName, Reservation, ReservationId, ReservationRequest, Ttl};

impl Mailbox {
    /// Reserves files for this agent: granted, or refused with the reservations in the way
    /// (their holders are told that this agent waits).
    pub async fn reserve(&self, wanted: ReservationRequest) -> Result<Reserved, MailboxError> {
        Ok(reservations::reserve(&mut self.asking().await?, wanted).await?)
    }

    /// Releases this agent's reservations in `project` that `which` names; their ids.
    pub async fn release_reserved(
        &self,
        project: ProjectName,
        which: Release,
    ) -> Result<Vec<ReservationId>, MailboxError> {
        Ok(reservations::release(&mut self.asking().await?, project, which).await?)
    }

    /// Gives this agent's reservations in `project` (`ids`, or all) a new TTL from now.
    pub async fn renew_reserved(
        &self,
        project: ProjectName,
        ids: Vec<ReservationId>,
        ttl: Ttl,
    ) -> Result<Vec<Reservation>, MailboxError> {
        Ok(reservations::renew(&mut self.asking().await?, project, ids, ttl).await?)
    }

    /// The live reservations in `project`, every holder's (their reasons are other agents'
    /// words: frame them before they reach a model).
    pub async fn reservations(
        &self,
        project: ProjectName,
    ) -> Result<Vec<Reservation>, MailboxError> {
        Ok(reservations::list(&mut self.asking().await?, project).await?)
    }
}
