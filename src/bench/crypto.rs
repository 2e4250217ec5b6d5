//! `bench crypto`: seal+sign and open+verify, the per-message cost at sender and recipient.

use super::CryptoArgs;
use super::stats::{Summary, measure};
use crate::crypto::{Identity, PublicIdentity, open, seal};
use crate::protocol::{Address, AgentName, Limits, Message};

pub(super) fn run(args: &CryptoArgs) -> anyhow::Result<Vec<Summary>> {
    let limits = Limits::default();
    let n = args.iterations as usize;
    let sender = Identity::generate();
    let from = Address::local(AgentName::new("alice")?);
    let recipients: Vec<(Address, Identity)> = (0..5)
        .map(|i| {
            Ok((
                Address::local(AgentName::new(&format!("r{i}"))?),
                Identity::generate(),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let keys: Vec<(Address, PublicIdentity)> = recipients
        .iter()
        .map(|(a, id)| (a.clone(), id.public().clone()))
        .collect();
    let kib = args.body_bytes as f64 / 1024.0;
    let mut rows = Vec::new();
    for count in [1, 5] {
        let to: Vec<Address> = recipients[..count].iter().map(|(a, _)| a.clone()).collect();
        let message = Message::new(
            from.clone(),
            to,
            "benchmark",
            "x".repeat(args.body_bytes as usize),
        );
        rows.push(measure(
            format!("seal+sign {kib:.1} KiB to {count} recipient(s)"),
            n,
            |_| {
                seal(&message, &sender, &keys, &limits)?;
                Ok(())
            },
        )?);
        let envelope = seal(&message, &sender, &keys, &limits)?.remove(0);
        let (me, my_identity) = &recipients[0];
        rows.push(measure(
            format!("open+verify {kib:.1} KiB (1 of {count})"),
            n,
            |_| {
                open(&envelope, me, my_identity, sender.public(), &limits)?;
                Ok(())
            },
        )?);
    }
    Ok(rows)
}
