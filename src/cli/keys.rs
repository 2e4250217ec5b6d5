//! `keys ADDRESS`: look up an agent's keys and pin them, showing the fingerprint to compare
//! with its owner (an agent on another relay is looked up at that relay, checked against the
//! key pinned for the relay); `trust-relay HOST --fingerprint FP`: accept a relay's new key
//! once its operator confirmed it.

use anyhow::{Context, bail};
use serde::Serialize;

use super::Ctx;
use super::output;
use crate::agent::Agent;
use crate::client::{Connection, Resolved, discover, resolve_keys};
use crate::protocol::{Address, Fingerprint, RelayName};
use crate::store::{KeyCheck, StoreHandle};

#[derive(Serialize)]
struct RelayView {
    name: RelayName,
    fingerprint: Fingerprint,
}

#[derive(Serialize)]
struct KeysView {
    address: Address,
    fingerprint: Fingerprint,
    /// `pinned` (first contact), `matches`, or `changed`.
    status: &'static str,
    /// The fingerprint pinned earlier, when the keys changed.
    pinned: Option<Fingerprint>,
    /// The other relay that vouched for the keys.
    relay: Option<RelayView>,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Looks `address`'s keys up and pins them on first contact (a changed key is recorded as a
/// change, never pinned).
fn look_up(ctx: &Ctx, address: &Address) -> anyhow::Result<Resolved> {
    let Agent {
        name,
        identity,
        store,
        owner,
        ..
    } = ctx.open_agent()?;
    let url = ctx.relay_url()?;
    let store = StoreHandle::spawn(store)?;
    let trusted = ctx.config.trusted_hosts.clone();
    Ok(runtime()?.block_on(async {
        // A control connection: a running `mailslot mcp` for this agent keeps its own.
        let mut conn = Connection::connect_control(&url, &name, &identity, owner).await?;
        let resolved = resolve_keys(&mut conn, &store, &trusted, address).await;
        conn.close().await;
        resolved
    })?)
}

pub(super) fn keys(ctx: &Ctx, address: Address) -> anyhow::Result<()> {
    let name = ctx.agent_name()?;
    let resolved = look_up(ctx, &address)?;
    let (status, pinned) = match resolved.check {
        KeyCheck::Pinned => ("pinned", None),
        KeyCheck::Matches => ("matches", None),
        KeyCheck::Changed { pinned, .. } => ("changed", Some(pinned)),
    };
    let view = KeysView {
        address: resolved.address,
        fingerprint: resolved.keys.fingerprint(),
        status,
        pinned,
        relay: resolved
            .relay
            .map(|(name, fingerprint)| RelayView { name, fingerprint }),
    };
    output::emit(ctx.json, &view, |v| {
        let mut lines = vec![match &v.pinned {
            None if v.status == "pinned" => format!(
                "{}: {} (pinned now; compare it with its owner)",
                v.address, v.fingerprint
            ),
            None => format!("{}: {} (as pinned)", v.address, v.fingerprint),
            Some(pinned) => format!(
                "KEY CHANGED: {} now presents {}, but {pinned} is pinned; mail to it stays sealed to the pinned keys. Ask its owner which is right; only if it is {}, run `{}`",
                v.address,
                v.fingerprint,
                v.fingerprint,
                output::command(
                    &name,
                    format_args!(
                        "contacts trust {} --fingerprint {}",
                        v.address, v.fingerprint
                    )
                )
            ),
        }];
        if let Some(relay) = &v.relay {
            lines.push(format!(
                "vouched for by the relay {}, key {}",
                relay.name, relay.fingerprint
            ));
        }
        lines.join("\n")
    })?;
    if view.status == "changed" {
        bail!("the keys of {} changed", view.address);
    }
    Ok(())
}

#[derive(Serialize)]
struct Trusted {
    relay: RelayName,
    fingerprint: Fingerprint,
    replaced: Option<Fingerprint>,
}

pub(super) fn trust_relay(
    ctx: &Ctx,
    relay: RelayName,
    fingerprint: Fingerprint,
) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    let info = runtime()?.block_on(discover(&ctx.config.trusted_hosts, &relay))?;
    if info.fingerprint != fingerprint {
        bail!(
            "{relay} presents the key {}, not {fingerprint}; nothing was changed. Check the fingerprint with {relay}'s operator",
            info.fingerprint
        );
    }
    let replaced = agent.store.trust_relay(&relay, &info.key)?;
    let trusted = Trusted {
        relay,
        fingerprint,
        replaced,
    };
    output::emit(ctx.json, &trusted, |t| match &t.replaced {
        Some(old) if *old != t.fingerprint => {
            format!("{}'s key is now {} (it was {old})", t.relay, t.fingerprint)
        }
        _ => format!("{}'s key {} is pinned", t.relay, t.fingerprint),
    })
}

#[derive(Serialize)]
struct TrustedContact {
    address: Address,
    fingerprint: Fingerprint,
    was: Fingerprint,
}

/// `contacts trust ADDRESS --fingerprint FP`: the owner accepts keys a peer presented that
/// its pinned keys did not sign. Checked before the passphrase is asked for.
pub(super) fn trust_contact(
    ctx: &Ctx,
    address: Address,
    fingerprint: Fingerprint,
) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    if !agent
        .store
        .presented_changes(&address)?
        .contains(&fingerprint)
    {
        // Keys its relay presents (as `whois` shows them) that no mail brought yet: looking
        // them up records the change; it moves no pin.
        drop(agent);
        look_up(ctx, &address).with_context(|| {
            format!(
                "{address} never presented {fingerprint} in mail, and its relay could not be asked"
            )
        })?;
        agent = ctx.open_agent()?;
    }
    if !agent
        .store
        .presented_changes(&address)?
        .contains(&fingerprint)
    {
        // The domain's refusal names what was seen; nothing changes.
        crate::mailbox::trust_presented_key(&mut agent, &address, &fingerprint)?;
    }
    super::owner::unlock(ctx)?;
    let was = crate::mailbox::trust_presented_key(&mut agent, &address, &fingerprint)?;
    output::emit(
        ctx.json,
        &TrustedContact {
            address,
            fingerprint,
            was,
        },
        |t| {
            format!(
                "{}'s keys {} are pinned (they were {}); mail from it is verified against them from now on",
                t.address, t.fingerprint, t.was
            )
        },
    )
}
