//! Groups over the held session (through `client::groups`): make one, see its members, list
//! this agent's, leave one. Joining is the owner's decision: a model's wish to join is only
//! recorded, for `mailslot groups` to show its owner (docs/decisions.md, "Groups").

use super::{Mailbox, MailboxError};
use crate::client::groups;
use crate::protocol::{Address, AgentName, GroupPolicy, GroupView};
use crate::store::{GroupMark, Membership};

impl Mailbox {
    /// Makes `group` on the agent's relay, owned by its owner's key, with the agent as its
    /// first member.
    pub async fn create_group(
        &self,
        group: AgentName,
        policy: GroupPolicy,
    ) -> Result<GroupView, MailboxError> {
        Ok(groups::create(&mut self.asking().await?, group, policy).await?)
    }

    /// The group `group` on the agent's relay, with its members.
    pub async fn group_members(&self, group: &AgentName) -> Result<GroupView, MailboxError> {
        Ok(groups::roster(&mut self.asking().await?, group).await?)
    }

    /// The groups on the agent's relay it is on or whose owner is its owner, and where it
    /// stands with groups by its store (joined, or wished and waiting for the owner).
    pub async fn groups(&self) -> Result<(Vec<GroupView>, Vec<GroupMark>), MailboxError> {
        let listed = groups::list(&mut self.asking().await?).await?;
        let marks = self.0.store.call(|s| s.group_marks()).await?;
        Ok((listed, marks))
    }

    /// Where the agent stands with groups by its store alone (joined, or wished and waiting
    /// for the owner): no relay call, for pages that read the relay themselves.
    pub async fn group_marks(&self) -> Result<Vec<GroupMark>, MailboxError> {
        Ok(self.0.store.call(|s| s.group_marks()).await?)
    }

    /// Records that the owner joined `group` for this agent (after the relay took the signed
    /// join), so the group's mail opens here from now, as the CLI's `groups join` records it.
    pub async fn record_join(&self, group: Address) -> Result<(), MailboxError> {
        self.0
            .store
            .call(move |s| s.mark_group(&group, Membership::Joined))
            .await?;
        Ok(())
    }

    /// Records that the agent's model wants to join `group`, for its owner to decide; where
    /// the agent stands with it now (a wish never undoes a join).
    pub async fn wish_to_join(&self, group: Address) -> Result<Membership, MailboxError> {
        let marked = group.clone();
        self.0
            .store
            .call(move |s| s.mark_group(&marked, Membership::Wished))
            .await?;
        let marks = self.0.store.call(|s| s.group_marks()).await?;
        Ok(marks
            .into_iter()
            .find(|m| m.group == group)
            .map_or(Membership::Wished, |m| m.state))
    }

    /// Leaves `group`: its mail stops reaching this agent. The relay's sentence.
    pub async fn leave_group(&self, group: Address) -> Result<String, MailboxError> {
        let detail = groups::leave(&mut self.asking().await?, group.clone()).await?;
        self.0.store.call(move |s| s.forget_group(&group)).await?;
        Ok(detail)
    }
}
