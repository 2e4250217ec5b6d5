//! The relay storage contract: what every backend of `relay::storage::Storage` must do, written
//! once against the trait and run for each backend: SQLite always, PostgreSQL on a private test
//! cluster whenever its binaries are installed (always in CI: `MAILSLOT_REQUIRE_POSTGRES=1`).
//! Each case opens a fresh store through a [`Backend`], which can also reopen the same data, so
//! durability is part of the contract. PostgreSQL's own cases (the delivery lease, two nodes on
//! one database) follow the shared ones.

use std::collections::HashMap;
use std::sync::Arc;

use crate::common::{self, postgres as pg};
use mailslot::crypto::{Identity, Owner};
use mailslot::protocol::{
    Address, AgentName, Bounce, CopyKey, GroupPolicy, GroupView, KeyRotation, MAX_HELD_PER_PROJECT,
    MAX_ROTATIONS, MessageId, OwnerKey, Pattern, Policy, ProjectName, PublicKeys, Reason, RelayKey,
    RelayName, RequestCode, Reservation, ReservationMode, ReservationRequest, Seq, Shown, Ttl,
    group_copy, read_link_copy,
};
use mailslot::relay::storage::{
    Accepted, AckOutcome, ConsentChange, ConsentLedger, ConsentOutcome, CopyStatus, DENIALS_KEPT,
    Epoch, GroupCreation, Groups, PostgresStorage, Queue, QueuedCopy, Quota, Registration,
    Registry, RelayPin, RelayPins, Reservations, Reserve, RosterChange, SqliteStorage, Storage,
    Which,
};

/// A backend under test: a fresh, empty store, and the same data opened again.
trait Backend: Sized {
    type S: Storage;
    /// A fresh store for `test`; `None` (the test skips, or fails in CI) when the backend is
    /// not installed.
    async fn fresh(test: &str) -> Option<Self>;
    async fn open(&self) -> Self::S;
    /// Adds invites as the operator's command does: beside the relay, not through it.
    async fn add_invites(&self, digests: &[[u8; 32]]);
}

struct Sqlite(tempfile::TempDir);

impl Sqlite {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }

    fn db(&self) -> std::path::PathBuf {
        self.0.path().join("relay.db")
    }
}

impl Backend for Sqlite {
    type S = SqliteStorage;

    /// Always there.
    async fn fresh(_test: &str) -> Option<Self> {
        Some(Self::new())
    }

    async fn open(&self) -> SqliteStorage {
        SqliteStorage::open(&self.db()).unwrap()
    }

    async fn add_invites(&self, digests: &[[u8; 32]]) {
        drop(self.open().await); // the schema exists before the operator makes invites
        SqliteStorage::add_invites(&self.db(), digests).unwrap()
    }
}

/// A fresh database on the test binary's PostgreSQL cluster; every `open` is another node's
/// connection to it.
struct Postgres {
    url: String,
}

impl Backend for Postgres {
    type S = PostgresStorage;

    async fn fresh(test: &str) -> Option<Self> {
        let cluster = pg::PgCluster::shared()?;
        Some(Self {
            url: cluster.create_database(test).await,
        })
    }

    async fn open(&self) -> PostgresStorage {
        PostgresStorage::connect(&self.url).await.unwrap()
    }

    /// Through another node's connection, as an operator's command would have.
    async fn add_invites(&self, digests: &[[u8; 32]]) {
        self.open().await.add_invites(digests).await.unwrap()
    }
}

impl Postgres {
    /// A plain connection of the test's own, beside the nodes', to look at or change the database.
    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    }
}

fn name(s: &str) -> AgentName {
    AgentName::new(s).unwrap()
}

fn keys() -> PublicKeys {
    Identity::generate().public().to_keys()
}

const ROOMY: Quota = Quota {
    count: 1000,
    bytes: 1 << 30,
};

fn far_future() -> i64 {
    jiff::Timestamp::now().as_millisecond() + 3_600_000
}

fn copies(to: &[&AgentName], body: &str) -> Vec<QueuedCopy> {
    to.iter()
        .map(|r| QueuedCopy {
            id: None,
            recipient: (*r).clone(),
            envelope: Arc::from(format!("{{\"to\":\"{r}\",\"body\":\"{body}\"}}").into_bytes()),
            group: None,
        })
        .collect()
}

/// Registers the names, open to everyone.
async fn agents<S: Storage>(s: &S, names: &[&str]) -> Vec<AgentName> {
    let mut out = Vec::new();
    for n in names {
        assert_eq!(
            s.register(name(n), keys(), None).await.unwrap(),
            Registration::Created
        );
        out.push(name(n));
    }
    out
}

async fn registration_is_first_come<B: Backend>(b: B) {
    let s = b.open().await;
    let alice = keys();
    assert_eq!(
        s.register(name("alice"), alice.clone(), None)
            .await
            .unwrap(),
        Registration::Created
    );
    assert_eq!(
        s.register(name("alice"), alice.clone(), None)
            .await
            .unwrap(),
        Registration::Unchanged
    );
    assert_eq!(
        s.register(name("alice"), keys(), None).await.unwrap(),
        Registration::NameTaken
    );
    assert_eq!(s.keys(name("alice")).await.unwrap(), Some(alice.clone()));
    assert_eq!(s.keys(name("bob")).await.unwrap(), None);
    drop(s);
    let s = b.open().await;
    assert_eq!(s.keys(name("alice")).await.unwrap(), Some(alice), "durable");
}

async fn an_invite_registers_one_name<B: Backend>(b: B) {
    let digest = mailslot::crypto::digest(b"msi_token");
    b.add_invites(&[digest]).await;
    let s = b.open().await;
    assert_eq!(
        s.register(name("alice"), keys(), Some(digest))
            .await
            .unwrap(),
        Registration::Created
    );
    assert_eq!(
        s.register(name("bob"), keys(), Some(digest)).await.unwrap(),
        Registration::BadInvite
    );
    assert_eq!(s.keys(name("bob")).await.unwrap(), None, "nothing changed");
}

async fn the_owner_key_is_compare_and_set<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice] = agents(&s, &["alice"]).await.try_into().unwrap();
    let (first, second) = (Owner::generate().public(), Owner::generate().public());
    assert!(s.set_owner(alice.clone(), first, None).await.unwrap());
    assert!(
        !s.set_owner(alice.clone(), second, None).await.unwrap(),
        "first come stays"
    );
    assert!(
        !s.set_owner(alice.clone(), second, Some(second))
            .await
            .unwrap()
    );
    assert!(
        s.set_owner(alice.clone(), second, Some(first))
            .await
            .unwrap()
    );
    assert_eq!(s.owner(alice).await.unwrap(), Some(second));
}

async fn copies_are_kept_in_order_per_recipient_until_acked<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob, carol] = agents(&s, &["alice", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let id = MessageId::new();
        ids.push(id);
        let to: Vec<&AgentName> = if i % 2 == 0 {
            vec![&bob, &carol]
        } else {
            vec![&bob]
        };
        let stored = s
            .accept(
                alice.clone(),
                id,
                copies(&to, &format!("m{i}")),
                ROOMY,
                far_future(),
                Policy::Open,
            )
            .await
            .unwrap();
        assert!(matches!(stored, Accepted::Stored(_)), "{stored:?}");
    }
    let bobs = s.pending(bob.clone(), 0, 100).await.unwrap();
    assert_eq!(bobs.len(), 5);
    assert!(bobs.windows(2).all(|w| w[0].seq < w[1].seq), "in order");
    for (i, q) in bobs.iter().enumerate() {
        assert!(String::from_utf8_lossy(&q.envelope).contains(&format!("m{i}")));
    }
    assert_eq!(s.waiting(carol.clone()).await.unwrap(), 3);
    assert_eq!(s.total_waiting().await.unwrap(), 8);

    // An ack is cumulative and for its recipient only; what is left is read after it.
    let lease = s.claim(bob.clone(), Shown::Online).await.unwrap();
    assert_eq!(
        s.ack(bob.clone(), bobs[2].seq, lease).await.unwrap(),
        AckOutcome::Applied(3)
    );
    let left = s.pending(bob.clone(), 0, 100).await.unwrap();
    assert_eq!(
        left.iter().map(|q| q.seq).collect::<Vec<_>>(),
        vec![bobs[3].seq, bobs[4].seq]
    );
    assert_eq!(
        s.waiting(carol.clone()).await.unwrap(),
        3,
        "carol's copies stay"
    );
    assert_eq!(
        s.pending(bob.clone(), bobs[3].seq, 100)
            .await
            .unwrap()
            .len(),
        1
    );
    drop(s);
    let s = b.open().await;
    assert_eq!(s.waiting(bob.clone()).await.unwrap(), 2, "acks are durable");
    let again = s.pending(bob, 0, 100).await.unwrap();
    assert_eq!(
        again.iter().map(|q| q.seq).collect::<Vec<_>>(),
        vec![bobs[3].seq, bobs[4].seq]
    );
}

async fn a_resend_is_stored_once_per_recipient<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob, carol] = agents(&s, &["alice", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    let id = MessageId::new();
    let send = |to: Vec<&AgentName>| {
        s.accept(
            alice.clone(),
            id,
            copies(&to, "x"),
            ROOMY,
            far_future(),
            Policy::Open,
        )
    };
    assert!(matches!(
        send(vec![&bob]).await.unwrap(),
        Accepted::Stored(_)
    ));
    assert_eq!(send(vec![&bob]).await.unwrap(), Accepted::Duplicate);
    // The same id to a recipient that has no copy yet is stored for that one only.
    assert!(matches!(
        send(vec![&bob, &carol]).await.unwrap(),
        Accepted::Stored(_)
    ));
    assert_eq!(s.waiting(bob).await.unwrap(), 1);
    assert_eq!(s.waiting(carol).await.unwrap(), 1);
}

async fn a_full_queue_refuses_the_whole_send<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob, carol] = agents(&s, &["alice", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    let tight = Quota {
        count: 1,
        bytes: 1 << 20,
    };
    let send = |to: Vec<&AgentName>| {
        s.accept(
            alice.clone(),
            MessageId::new(),
            copies(&to, "x"),
            tight,
            far_future(),
            Policy::Open,
        )
    };
    assert!(matches!(
        send(vec![&bob]).await.unwrap(),
        Accepted::Stored(_)
    ));
    assert_eq!(
        send(vec![&carol, &bob]).await.unwrap(),
        Accepted::QuotaFull(bob.clone())
    );
    assert_eq!(s.waiting(carol).await.unwrap(), 0, "all or none");
    assert_eq!(s.waiting(bob).await.unwrap(), 1);
}

async fn consent_is_checked_inside_the_write<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob, carol] = agents(&s, &["alice", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    let send = |default: Policy| {
        s.accept(
            alice.clone(),
            MessageId::new(),
            copies(&[&bob], "x"),
            ROOMY,
            far_future(),
            default,
        )
    };
    assert_eq!(
        send(Policy::Contacts).await.unwrap(),
        Accepted::NotAllowed(bob.clone()),
        "a stranger under contacts"
    );
    assert!(matches!(
        send(Policy::Open).await.unwrap(),
        Accepted::Stored(_)
    ));

    // bob's own policy wins over the default.
    let set = |policy| ConsentChange::SetPolicy {
        owner: bob.clone(),
        policy,
    };
    assert_eq!(
        s.consent(set(Policy::Closed)).await.unwrap(),
        ConsentOutcome::Applied(None)
    );
    assert_eq!(
        send(Policy::Open).await.unwrap(),
        Accepted::NotAllowed(bob.clone())
    );
    s.consent(set(Policy::Contacts)).await.unwrap();

    // A request with its code makes them contacts; a wrong code changes nothing.
    let code = RequestCode::from_random([1, 2, 3, 4, 5]);
    let request = ConsentChange::Request {
        from: alice.clone(),
        to: bob.clone(),
        note: "hi".into(),
        code: code.clone(),
        expires_at_ms: far_future(),
        max_pending: 3,
        max_to_target: 20,
        max_from_relay: 50,
    };
    assert_eq!(
        s.consent(request).await.unwrap(),
        ConsentOutcome::Applied(None)
    );
    let approve = |code| ConsentChange::Approve {
        target: bob.clone(),
        requester: alice.clone(),
        code,
    };
    assert_eq!(
        s.consent(approve(RequestCode::from_random([9; 5])))
            .await
            .unwrap(),
        ConsentOutcome::NoSuchRequest
    );
    assert_eq!(
        send(Policy::Contacts).await.unwrap(),
        Accepted::NotAllowed(bob.clone())
    );
    assert_eq!(
        s.consent(approve(code)).await.unwrap(),
        ConsentOutcome::Applied(Some(alice.clone()))
    );
    assert!(matches!(
        send(Policy::Contacts).await.unwrap(),
        Accepted::Stored(_)
    ));

    // A block ends it, even when bob is open to everyone.
    s.consent(set(Policy::Open)).await.unwrap();
    s.consent(ConsentChange::Block {
        owner: bob.clone(),
        peer: alice.clone(),
    })
    .await
    .unwrap();
    assert_eq!(
        send(Policy::Open).await.unwrap(),
        Accepted::NotAllowed(bob.clone())
    );
    let state = s.consent_state(bob.clone(), 0).await.unwrap();
    assert_eq!(state.blocked, vec![alice.clone()]);
    assert!(state.contacts.is_empty());
    // carol, not blocked, writes to open bob.
    let from_carol = s
        .accept(
            carol,
            MessageId::new(),
            copies(&[&bob], "y"),
            ROOMY,
            far_future(),
            Policy::Open,
        )
        .await
        .unwrap();
    assert!(matches!(from_carol, Accepted::Stored(_)));
}

async fn a_replaced_session_cannot_ack<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob] = agents(&s, &["alice", "bob"]).await.try_into().unwrap();
    for body in ["one", "two"] {
        s.accept(
            alice.clone(),
            MessageId::new(),
            copies(&[&bob], body),
            ROOMY,
            far_future(),
            Policy::Open,
        )
        .await
        .unwrap();
    }
    let queued = s.pending(bob.clone(), 0, 10).await.unwrap();
    let first = s.claim(bob.clone(), Shown::Online).await.unwrap();
    let second = s.claim(bob.clone(), Shown::Online).await.unwrap();
    assert!(second > first, "a later claim has a higher epoch");
    assert_eq!(
        s.ack(bob.clone(), queued[1].seq, first).await.unwrap(),
        AckOutcome::Fenced,
        "the replaced session's ack is refused"
    );
    assert_eq!(
        s.waiting(bob.clone()).await.unwrap(),
        2,
        "and changed nothing"
    );
    assert_eq!(
        s.ack(bob.clone(), queued[0].seq, second).await.unwrap(),
        AckOutcome::Applied(1)
    );
    // Another agent's claim is its own.
    let alices = s.claim(alice.clone(), Shown::Online).await.unwrap();
    assert_eq!(
        s.ack(bob.clone(), queued[1].seq, second).await.unwrap(),
        AckOutcome::Applied(1),
        "alice's claim ({alices}) did not fence bob"
    );
}

async fn expired_copies_go<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob] = agents(&s, &["alice", "bob"]).await.try_into().unwrap();
    let now = jiff::Timestamp::now().as_millisecond();
    let soon = MessageId::new();
    for (id, expires, body) in [
        (soon, now + 1_000, "soon"),
        (MessageId::new(), far_future(), "later"),
    ] {
        s.accept(
            alice.clone(),
            id,
            copies(&[&bob], body),
            ROOMY,
            expires,
            Policy::Open,
        )
        .await
        .unwrap();
    }
    let bounced = s.expire(now + 2_000).await.unwrap();
    assert_eq!(bounced.len(), 1, "one copy expired: {bounced:?}");
    assert_eq!(bounced[0].0, alice, "the bounce is the sender's");
    assert_eq!(
        (bounced[0].1.id, &bounced[0].1.to),
        (soon, &Address::local(bob.clone()))
    );
    let left = s.pending(bob.clone(), 0, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert!(String::from_utf8_lossy(&left[0].envelope).contains("later"));
    assert!(s.expire(now + 2_000).await.unwrap().is_empty(), "once");

    // The bounce waits for its sender, durably, until the sender acknowledges it.
    drop(s);
    let s = b.open().await;
    let waiting = s.bounces(alice.clone(), 10).await.unwrap();
    assert_eq!(waiting, vec![bounced[0].1.clone()]);
    assert!(s.bounces(bob.clone(), 10).await.unwrap().is_empty());
    assert_eq!(
        s.ack_bounces(alice.clone(), vec![waiting[0].key()])
            .await
            .unwrap(),
        1
    );
    assert!(s.bounces(alice, 10).await.unwrap().is_empty());
}

async fn copy_statuses_say_queued_bounced_or_gone<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob, carol] = agents(&s, &["alice", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    let now = jiff::Timestamp::now().as_millisecond();
    let (both, soon) = (MessageId::new(), MessageId::new());
    s.accept(
        alice.clone(),
        both,
        copies(&[&bob, &carol], "both"),
        ROOMY,
        far_future(),
        Policy::Open,
    )
    .await
    .unwrap();
    s.accept(
        alice.clone(),
        soon,
        copies(&[&bob], "soon"),
        ROOMY,
        // Past already (expiry has not run yet): a reopen must not bring it back.
        now - 1_000,
        Policy::Open,
    )
    .await
    .unwrap();
    let key = |id: MessageId, to: &AgentName| CopyKey {
        id,
        to: Address::local(to.clone()),
    };
    let asked = vec![
        key(both, &bob),
        key(both, &carol),
        key(soon, &bob),
        key(MessageId::new(), &bob),
    ];
    use CopyStatus::{Bounced, Gone, Queued};
    assert_eq!(
        s.copy_statuses(alice.clone(), asked.clone()).await.unwrap(),
        vec![Queued, Queued, Queued, Gone],
        "a copy never stored is gone"
    );
    assert_eq!(
        s.copy_statuses(carol.clone(), vec![key(both, &bob)])
            .await
            .unwrap(),
        vec![Gone],
        "only the sender's own copies count"
    );

    // Bob takes the first message: his copy is gone, carol's still queued.
    let epoch = s.claim(bob.clone(), Shown::Online).await.unwrap();
    let queued = s.pending(bob.clone(), 0, 10).await.unwrap();
    assert_eq!(
        s.ack(bob.clone(), queued[0].seq, epoch).await.unwrap(),
        AckOutcome::Applied(1)
    );
    // The second one expires: bounced, in the same write that took it out of the queue.
    assert_eq!(s.expire(now).await.unwrap().len(), 1);
    let expected = vec![Gone, Queued, Bounced, Gone];
    assert_eq!(
        s.copy_statuses(alice.clone(), asked.clone()).await.unwrap(),
        expected
    );

    // What it says is what the relay keeps: the same after a reopen.
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.copy_statuses(alice.clone(), asked.clone()).await.unwrap(),
        expected
    );
    // A bounce the sender acknowledged is gone too (its client recorded it before).
    s.ack_bounces(alice.clone(), vec![key(soon, &bob)])
        .await
        .unwrap();
    assert_eq!(
        s.copy_statuses(alice, asked).await.unwrap(),
        vec![Gone, Queued, Gone, Gone]
    );
}

async fn a_retired_name_is_held_then_free<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob] = agents(&s, &["alice", "bob"]).await.try_into().unwrap();
    s.consent(ConsentChange::Block {
        owner: bob.clone(),
        peer: alice.clone(),
    })
    .await
    .unwrap();
    let until = far_future();
    assert!(s.retire(bob.clone(), until).await.unwrap());
    assert!(!s.retire(bob.clone(), until).await.unwrap(), "once");
    assert_eq!(s.keys(bob.clone()).await.unwrap(), None);
    assert_eq!(
        s.register(bob.clone(), keys(), None).await.unwrap(),
        Registration::Retired(until)
    );
    // Past its grace (retired until now), the name is taken afresh with none of its past.
    let [carol] = agents(&s, &["carol"]).await.try_into().unwrap();
    assert!(s.retire(carol.clone(), 0).await.unwrap());
    assert_eq!(
        s.register(carol.clone(), keys(), None).await.unwrap(),
        Registration::Created
    );
    let state = s.consent_state(bob, 0).await.unwrap();
    assert!(state.blocked.is_empty(), "a retired agent's blocks went");
}

/// A statement moving `agent` from `old` to `new` (the storage keeps it; signatures are
/// the relay's to check, not the storage's).
fn rotation(agent: &AgentName, old: &PublicKeys, new: &PublicKeys, at_ms: i64) -> KeyRotation {
    KeyRotation {
        agent: agent.clone(),
        old: old.clone(),
        new: new.clone(),
        at_ms,
        old_signature: vec![1; 64],
        new_signature: vec![2; 64],
    }
}

async fn keys_rotate_only_from_the_registered_ones<B: Backend>(b: B) {
    let s = b.open().await;
    let bob = name("bob");
    let k0 = keys();
    s.register(bob.clone(), k0.clone(), None).await.unwrap();
    assert!(s.rotations(bob.clone()).await.unwrap().is_empty());
    let k1 = keys();
    let first = rotation(&bob, &k0, &k1, 1);
    assert!(s.rotate(first.clone()).await.unwrap());
    assert_eq!(s.keys(bob.clone()).await.unwrap(), Some(k1.clone()));
    // A replay of the same step, or a step from keys that are not registered, changes nothing.
    assert!(!s.rotate(first.clone()).await.unwrap(), "replayed");
    assert!(
        !s.rotate(rotation(&bob, &k0, &keys(), 2)).await.unwrap(),
        "stale"
    );
    assert!(
        !s.rotate(rotation(&name("nobody"), &k0, &keys(), 2))
            .await
            .unwrap()
    );
    assert_eq!(s.keys(bob.clone()).await.unwrap(), Some(k1.clone()));
    // The chain grows oldest first and keeps the last MAX_ROTATIONS steps, durably.
    let mut at = k1;
    for i in 0..MAX_ROTATIONS {
        let next = keys();
        assert!(
            s.rotate(rotation(&bob, &at, &next, 10 + i as i64))
                .await
                .unwrap()
        );
        at = next;
    }
    drop(s);
    let s = b.open().await;
    let chain = s.rotations(bob.clone()).await.unwrap();
    assert_eq!(chain.len(), MAX_ROTATIONS);
    assert_eq!(chain[0].at_ms, 10, "the oldest went");
    assert_eq!(chain.last().unwrap().new, at);
    assert_eq!(s.keys(bob.clone()).await.unwrap(), Some(at));
    // A retired name's chain goes with it.
    assert!(s.retire(bob.clone(), 0).await.unwrap());
    assert!(s.rotations(bob).await.unwrap().is_empty());
}

/// The contract's cases for one backend; `$make(test_name)` gives `Option<B>` (`None`: the
/// backend is not available here and the case is skipped).
/// The queue this relay keeps for mail on its way to the relay `host`.
fn mailbox(host: &str) -> AgentName {
    AgentName::relay_mailbox(&RelayName::new(host).unwrap()).unwrap()
}

fn addr(s: &str) -> Address {
    Address::parse(s).unwrap()
}

async fn a_relay_mailbox_takes_mail_past_consent_and_keeps_its_name<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, carol] = agents(&s, &["alice", "carol"]).await.try_into().unwrap();
    let relay_b = mailbox("relay-b");
    let send = |to: &AgentName, quota: Quota| {
        s.accept(
            alice.clone(),
            MessageId::new(),
            copies(&[to], "over the link"),
            quota,
            far_future(),
            Policy::Contacts,
        )
    };
    assert_eq!(
        send(&carol, ROOMY).await.unwrap(),
        Accepted::NotAllowed(carol.clone()),
        "the contacts default holds for agents"
    );
    assert_eq!(
        send(&relay_b, ROOMY).await.unwrap(),
        Accepted::Stored(vec![relay_b.clone()]),
        "the relay it leads to applies consent, not this one"
    );
    let one = Quota {
        count: 1,
        bytes: 1 << 20,
    };
    assert_eq!(
        send(&relay_b, one).await.unwrap(),
        Accepted::QuotaFull(relay_b.clone()),
        "quotas still hold"
    );
    assert_eq!(s.waiting(relay_b.clone()).await.unwrap(), 1);

    drop(s);
    let s = b.open().await;
    let queued = s.pending(relay_b.clone(), 0, 10).await.unwrap();
    assert_eq!(queued.len(), 1, "the mailbox came back under its name");
    assert!(String::from_utf8_lossy(&queued[0].envelope).contains("over the link"));
    let epoch = s.claim(relay_b.clone(), Shown::Online).await.unwrap();
    assert_eq!(
        s.ack(relay_b.clone(), queued[0].seq, epoch).await.unwrap(),
        AckOutcome::Applied(1)
    );
    drop(s);
    let s = b.open().await;
    assert!(s.pending(relay_b.clone(), 0, 10).await.unwrap().is_empty());
    assert_eq!(s.waiting(relay_b).await.unwrap(), 0);
}

async fn expiry_leaves_relay_mailboxes_to_their_link<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob] = agents(&s, &["alice", "bob"]).await.try_into().unwrap();
    let relay_b = mailbox("relay-b");
    let now = jiff::Timestamp::now().as_millisecond();
    let (to_bob, to_relay) = (MessageId::new(), MessageId::new());
    for (id, to) in [(to_bob, &bob), (to_relay, &relay_b)] {
        let mut late = copies(&[to], "late");
        if to == &relay_b {
            late[0].id = Some(id.relay_copy(&addr("dave@relay-b")));
        }
        let stored = s
            .accept(alice.clone(), id, late, ROOMY, now - 1_000, Policy::Open)
            .await
            .unwrap();
        assert!(matches!(stored, Accepted::Stored(_)), "{stored:?}");
    }
    let bounced = s.expire(now).await.unwrap();
    assert_eq!(
        bounced,
        vec![(
            alice.clone(),
            Bounce {
                id: to_bob,
                to: Address::local(bob.clone()),
                expired_at: bounced[0].1.expired_at,
            }
        )],
        "the agent's copy expired in the same call, the mailbox's did not"
    );
    assert!(s.pending(bob.clone(), 0, 10).await.unwrap().is_empty());
    assert_eq!(s.pending(relay_b.clone(), 0, 10).await.unwrap().len(), 1);

    // Nor when the relay starts again past its expiry.
    drop(s);
    let s = b.open().await;
    assert!(s.expire(now + 3_600_000).await.unwrap().is_empty());
    assert_eq!(s.pending(relay_b.clone(), 0, 10).await.unwrap().len(), 1);
    assert_eq!(
        s.copy_statuses(
            alice,
            vec![CopyKey {
                id: to_relay,
                to: addr("dave@relay-b"),
            }]
        )
        .await
        .unwrap(),
        vec![CopyStatus::Queued]
    );
}

async fn bounces_a_link_records_are_kept_once<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice] = agents(&s, &["alice"]).await.try_into().unwrap();
    let relay_b = mailbox("relay-b");
    let id = MessageId::new();
    // bob@relay-b's copy, under its own id in the relay's mailbox, as the relay stores it.
    let mut remote = copies(&[&relay_b], "remote");
    remote[0].id = Some(id.relay_copy(&addr("bob@relay-b")));
    s.accept(alice.clone(), id, remote, ROOMY, far_future(), Policy::Open)
        .await
        .unwrap();
    let bob_b = CopyKey {
        id,
        to: addr("bob@relay-b"),
    };
    let asked = vec![
        bob_b.clone(),
        CopyKey {
            id,
            to: addr("bob"),
        },
        CopyKey {
            id,
            to: addr("bob@relay-c"),
        },
    ];
    use CopyStatus::{Bounced, Gone, Queued};
    assert_eq!(
        s.copy_statuses(alice.clone(), asked.clone()).await.unwrap(),
        vec![Queued, Gone, Gone],
        "a remote copy waits in its relay's mailbox, and only there"
    );

    // The link takes it ...
    let epoch = s.claim(relay_b.clone(), Shown::Online).await.unwrap();
    let queued = s.pending(relay_b.clone(), 0, 10).await.unwrap();
    assert_eq!(
        s.ack(relay_b.clone(), queued[0].seq, epoch).await.unwrap(),
        AckOutcome::Applied(1)
    );
    assert_eq!(
        s.copy_statuses(alice.clone(), asked.clone()).await.unwrap(),
        vec![Gone, Gone, Gone]
    );
    // ... and relay-b refuses it: the link bounces it, twice after a crash.
    let bounce = Bounce {
        id,
        to: addr("bob@relay-b"),
        expired_at: jiff::Timestamp::from_millisecond(1_700_000_000_000).unwrap(),
    };
    for _ in 0..2 {
        s.record_bounces(alice.clone(), vec![bounce.clone()])
            .await
            .unwrap();
    }
    assert_eq!(
        s.bounces(alice.clone(), 10).await.unwrap(),
        vec![bounce.clone()]
    );
    assert_eq!(
        s.copy_statuses(alice.clone(), asked.clone()).await.unwrap(),
        vec![Bounced, Gone, Gone]
    );

    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.bounces(alice.clone(), 10).await.unwrap(),
        vec![bounce],
        "durable"
    );
    assert_eq!(s.ack_bounces(alice.clone(), vec![bob_b]).await.unwrap(), 1);
    assert_eq!(
        s.copy_statuses(alice.clone(), asked).await.unwrap(),
        vec![Gone, Gone, Gone]
    );
    assert!(s.bounces(alice, 10).await.unwrap().is_empty());
}

async fn a_relay_key_is_pinned_on_first_contact<B: Backend>(b: B) {
    let s = b.open().await;
    let relay = |n: &str| RelayName::new(n).unwrap();
    let (first, second) = (RelayKey::from_bytes([1; 32]), RelayKey::from_bytes([2; 32]));
    assert_eq!(
        s.pin_relay(relay("relay-b"), first).await.unwrap(),
        RelayPin::Pinned
    );
    assert_eq!(
        s.pin_relay(relay("relay-b"), first).await.unwrap(),
        RelayPin::Matches
    );
    assert_eq!(
        s.pin_relay(relay("relay-b"), second).await.unwrap(),
        RelayPin::Changed { pinned: first }
    );
    assert_eq!(
        s.pin_relay(relay("relay-c:4443"), second).await.unwrap(),
        RelayPin::Pinned,
        "each relay has its own pin"
    );
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.pin_relay(relay("relay-b"), second).await.unwrap(),
        RelayPin::Changed { pinned: first },
        "never replaced, durably"
    );
    assert_eq!(
        s.pin_relay(relay("relay-b"), first).await.unwrap(),
        RelayPin::Matches
    );
    assert_eq!(s.pinned_relay(relay("relay-b")).await.unwrap(), Some(first));
    assert_eq!(s.pinned_relay(relay("relay-d")).await.unwrap(), None);
    s.pin_relay(relay("localhost:4443"), second).await.unwrap();
    let mut named = s.relays_pinned_with(second).await.unwrap();
    named.sort();
    assert_eq!(
        named,
        [relay("localhost:4443"), relay("relay-c:4443")],
        "one key, every name it is pinned for"
    );
}

/// A contact request from `from` to `to` with the bounds of `max_to_target` and
/// `max_from_relay`.
async fn the_operator_lists_removes_and_replaces_relay_pins<B: Backend>(b: B) {
    let s = b.open().await;
    let relay = |n: &str| RelayName::new(n).unwrap();
    let [first, second, third] = [1, 2, 3].map(|b| RelayKey::from_bytes([b; 32]));
    assert!(s.relay_pins().await.unwrap().is_empty());
    s.pin_relay(relay("relay-c"), second).await.unwrap();
    s.pin_relay(relay("relay-b"), first).await.unwrap();
    let listed = s.relay_pins().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|p| (p.relay.clone(), p.key))
            .collect::<Vec<_>>(),
        [(relay("relay-b"), first), (relay("relay-c"), second)],
        "every pin, by name"
    );
    assert!(listed.iter().all(|p| p.pinned_at_ms > 1_700_000_000_000));

    // Replaced only from the key the operator was shown.
    assert!(
        !s.repin_relay(relay("relay-b"), Some(second), third)
            .await
            .unwrap()
    );
    assert_eq!(s.pinned_relay(relay("relay-b")).await.unwrap(), Some(first));
    assert!(
        s.repin_relay(relay("relay-b"), Some(first), third)
            .await
            .unwrap()
    );
    assert_eq!(
        s.pin_relay(relay("relay-b"), third).await.unwrap(),
        RelayPin::Matches
    );
    assert_eq!(
        s.pin_relay(relay("relay-b"), first).await.unwrap(),
        RelayPin::Changed { pinned: third },
        "the old key is refused now"
    );
    // From nothing pinned: only while nothing is.
    assert!(!s.repin_relay(relay("relay-c"), None, first).await.unwrap());
    assert!(s.repin_relay(relay("relay-d"), None, first).await.unwrap());

    // Removed: the key it held; the next contact pins afresh.
    assert_eq!(s.unpin_relay(relay("relay-c")).await.unwrap(), Some(second));
    assert_eq!(s.unpin_relay(relay("relay-c")).await.unwrap(), None);
    assert_eq!(s.pinned_relay(relay("relay-c")).await.unwrap(), None);
    assert_eq!(
        s.pin_relay(relay("relay-c"), third).await.unwrap(),
        RelayPin::Pinned
    );
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.relay_pins()
            .await
            .unwrap()
            .iter()
            .map(|p| (p.relay.clone(), p.key))
            .collect::<Vec<_>>(),
        [
            (relay("relay-b"), third),
            (relay("relay-c"), third),
            (relay("relay-d"), first)
        ],
        "durably"
    );
}

fn request(
    from: &AgentName,
    to: &AgentName,
    max_to_target: u32,
    max_from_relay: u32,
) -> ConsentChange {
    ConsentChange::Request {
        from: from.clone(),
        to: to.clone(),
        note: String::new(),
        code: RequestCode::from_random([9, 8, 7, 6, 5]),
        expires_at_ms: far_future(),
        max_pending: 3,
        max_to_target,
        max_from_relay,
    }
}

async fn open_requests_are_bounded_per_target_and_per_relay<B: Backend>(b: B) {
    let s = b.open().await;
    let [bob, dave] = agents(&s, &["bob", "dave"]).await.try_into().unwrap();
    let remote = |n: &str| AgentName::remote_agent(&Address::parse(n).unwrap()).unwrap();
    for i in 0..3 {
        let from = remote(&format!("u{i}@relay-c"));
        assert_eq!(
            s.consent(request(&from, &bob, 3, 5)).await.unwrap(),
            ConsentOutcome::Applied(None)
        );
    }
    assert_eq!(
        s.consent(request(&remote("u3@relay-c"), &bob, 3, 5))
            .await
            .unwrap(),
        ConsentOutcome::TargetFull
    );
    assert_eq!(
        s.consent(request(&remote("u0@relay-c"), &bob, 3, 5))
            .await
            .unwrap(),
        ConsentOutcome::Applied(None),
        "asking again replaces, and is not counted twice"
    );
    for i in 3..5 {
        let from = remote(&format!("u{i}@relay-c"));
        assert_eq!(
            s.consent(request(&from, &dave, 3, 5)).await.unwrap(),
            ConsentOutcome::Applied(None)
        );
    }
    assert_eq!(
        s.consent(request(&remote("u5@relay-c"), &dave, 3, 5))
            .await
            .unwrap(),
        ConsentOutcome::RelayFull,
        "five open from relay-c in all"
    );
    assert_eq!(
        s.consent(request(&remote("u5@relay-cc"), &dave, 3, 5))
            .await
            .unwrap(),
        ConsentOutcome::Applied(None),
        "another relay has its own count"
    );
}

/// A request from `from` to `to` lapsing at `expires_at_ms`, denied at once.
async fn ask_and_deny<S: Storage>(s: &S, from: &AgentName, to: &AgentName, expires_at_ms: i64) {
    let mut asked = request(from, to, 20, 50);
    if let ConsentChange::Request {
        expires_at_ms: at, ..
    } = &mut asked
    {
        *at = expires_at_ms;
    }
    assert_eq!(
        s.consent(asked).await.unwrap(),
        ConsentOutcome::Applied(None)
    );
    let deny = ConsentChange::Deny {
        target: to.clone(),
        requester: from.clone(),
    };
    assert_eq!(
        s.consent(deny).await.unwrap(),
        ConsentOutcome::Applied(Some(from.clone()))
    );
}

async fn a_denial_is_kept_for_its_requester_and_taken_once<B: Backend>(b: B) {
    let s = b.open().await;
    let [alice, bob, carol, dave] = agents(&s, &["alice", "bob", "carol", "dave"])
        .await
        .try_into()
        .unwrap();
    let now = jiff::Timestamp::now().as_millisecond();
    ask_and_deny(&s, &alice, &bob, far_future()).await;
    // carol's denial lapses with its request, a minute from now.
    ask_and_deny(&s, &alice, &carol, now + 60_000).await;
    // Another relay's requester hears through its own relay: nothing is kept here for it.
    let remote = AgentName::remote_agent(&Address::parse("erin@relay-c").unwrap()).unwrap();
    ask_and_deny(&s, &remote, &bob, far_future()).await;
    assert_eq!(s.take_denials(remote, now).await.unwrap(), []);

    // Kept across a restart, handed once; a lapsed one is not handed.
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.take_denials(alice.clone(), now + 120_000).await.unwrap(),
        [bob],
        "bob's denial is handed, carol's lapsed with its request"
    );
    assert_eq!(s.take_denials(alice.clone(), now).await.unwrap(), []);

    // At most DENIALS_KEPT per requester: the one closest to lapsing goes first.
    let targets: Vec<String> = (0..=DENIALS_KEPT).map(|i| format!("t{i:02}")).collect();
    let targets = agents(&s, &targets.iter().map(String::as_str).collect::<Vec<_>>()).await;
    for (i, target) in targets.iter().enumerate() {
        ask_and_deny(&s, &dave, target, far_future() + i as i64).await;
    }
    assert_eq!(
        s.take_denials(dave.clone(), now).await.unwrap(),
        targets[1..],
        "oldest request first, the first one dropped"
    );
}

async fn the_relays_own_key_is_recorded_once<B: Backend>(b: B) {
    let s = b.open().await;
    let (first, second) = (RelayKey::from_bytes([1; 32]), RelayKey::from_bytes([2; 32]));
    // A database from before the key was recorded, or a new one: the first start records it.
    assert_eq!(s.pin_own_key(first).await.unwrap(), RelayPin::Pinned);
    assert_eq!(s.pin_own_key(first).await.unwrap(), RelayPin::Matches);
    assert_eq!(
        s.pin_own_key(second).await.unwrap(),
        RelayPin::Changed { pinned: first }
    );
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.pin_own_key(second).await.unwrap(),
        RelayPin::Changed { pinned: first },
        "never replaced, durably"
    );
    assert_eq!(
        s.pin_relay(RelayName::new("relay-b").unwrap(), second)
            .await
            .unwrap(),
        RelayPin::Pinned,
        "apart from other relays' pins"
    );
}

async fn mail_from_another_relay_meets_its_recipients_consent<B: Backend>(b: B) {
    let s = b.open().await;
    let [bob, carol] = agents(&s, &["bob", "carol"]).await.try_into().unwrap();
    assert!(matches!(
        s.consent(ConsentChange::SetPolicy {
            owner: bob.clone(),
            policy: Policy::Open,
        })
        .await
        .unwrap(),
        ConsentOutcome::Applied(_)
    ));
    let relay_a = mailbox("relay-a");
    let send = |to: &AgentName| {
        s.accept(
            relay_a.clone(),
            MessageId::new(),
            copies(&[to], "from relay-a"),
            ROOMY,
            far_future(),
            Policy::Contacts,
        )
    };
    assert_eq!(
        send(&bob).await.unwrap(),
        Accepted::Stored(vec![bob.clone()]),
        "an open recipient takes it"
    );
    assert_eq!(
        send(&carol).await.unwrap(),
        Accepted::NotAllowed(carol.clone()),
        "a contacts one does not"
    );
    drop(s);
    let s = b.open().await;
    let queued = s.pending(bob, 0, 10).await.unwrap();
    assert_eq!(queued.len(), 1, "its sender's name read back");
    assert!(s.pending(carol, 0, 10).await.unwrap().is_empty());
}

async fn a_block_of_a_whole_relay_refuses_its_agents_unless_one_is_a_contact<B: Backend>(b: B) {
    let s = b.open().await;
    let [bob] = agents(&s, &["bob"]).await.try_into().unwrap();
    let remote = |a: &str| AgentName::remote_agent(&addr(a)).unwrap();
    let (alice, carol, dave) = (
        remote("alice@relay-a"),
        remote("carol@relay-a"),
        remote("dave@relay-c"),
    );
    let relay_a = AgentName::any_at(&RelayName::new("relay-a").unwrap()).unwrap();
    let apply = |change| s.consent(change);
    for change in [
        ConsentChange::Block {
            owner: bob.clone(),
            peer: relay_a.clone(),
        },
        ConsentChange::Request {
            from: carol.clone(),
            to: bob.clone(),
            note: String::new(),
            code: "7KQF-3MZA".parse().unwrap(),
            expires_at_ms: far_future(),
            max_pending: 3,
            max_to_target: 20,
            max_from_relay: 50,
        },
    ] {
        let outcome = apply(change).await.unwrap();
        assert!(
            matches!(
                outcome,
                ConsentOutcome::Applied(_) | ConsentOutcome::NotAllowed
            ),
            "{outcome:?}"
        );
    }
    let send = |from: &AgentName| {
        s.accept(
            from.clone(),
            MessageId::new(),
            copies(&[&bob], "hello"),
            ROOMY,
            far_future(),
            Policy::Open,
        )
    };
    assert_eq!(
        send(&alice).await.unwrap(),
        Accepted::NotAllowed(bob.clone())
    );
    assert_eq!(
        send(&dave).await.unwrap(),
        Accepted::Stored(vec![bob.clone()]),
        "another relay's agents are not blocked"
    );
    let state = s.consent_state(bob.clone(), 0).await.unwrap();
    assert_eq!(
        state.blocked,
        vec![relay_a.clone()],
        "read back as the relay's block"
    );
    assert!(
        state.incoming.is_empty(),
        "a request from the blocked relay was refused"
    );
    // A contact at that relay is the owner's own choice, and passes.
    s.consent(ConsentChange::Unblock {
        owner: bob.clone(),
        peer: relay_a.clone(),
    })
    .await
    .unwrap();
    s.consent(ConsentChange::Request {
        from: carol.clone(),
        to: bob.clone(),
        note: String::new(),
        code: "7KQF-3MZA".parse().unwrap(),
        expires_at_ms: far_future(),
        max_pending: 3,
        max_to_target: 20,
        max_from_relay: 50,
    })
    .await
    .unwrap();
    s.consent(ConsentChange::Approve {
        target: bob.clone(),
        requester: carol.clone(),
        code: "7KQF-3MZA".parse().unwrap(),
    })
    .await
    .unwrap();
    s.consent(ConsentChange::Block {
        owner: bob.clone(),
        peer: relay_a,
    })
    .await
    .unwrap();
    assert_eq!(
        send(&carol).await.unwrap(),
        Accepted::Stored(vec![bob.clone()]),
        "the contact's own row comes before its relay's block"
    );
    assert_eq!(send(&alice).await.unwrap(), Accepted::NotAllowed(bob));
}

fn wanted(patterns: &[&str], mode: ReservationMode, ttl_secs: u32) -> ReservationRequest {
    ReservationRequest {
        project: ProjectName::new("demo").unwrap(),
        patterns: patterns.iter().map(|p| Pattern::new(p).unwrap()).collect(),
        mode,
        reason: Reason::new("refactoring").unwrap(),
        ttl: Ttl::from_secs(ttl_secs).unwrap(),
    }
}

fn granted(outcome: Reserve) -> Reservation {
    match outcome {
        Reserve::Granted(r) => r,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn conflicts(outcome: Reserve) -> Vec<Reservation> {
    match outcome {
        Reserve::Conflicts(c) => c,
        other => panic!("expected conflicts, got {other:?}"),
    }
}

fn demo() -> ProjectName {
    ProjectName::new("demo").unwrap()
}

async fn reservations_conflict_by_mode_and_holder<B: Backend>(b: B) {
    use ReservationMode::{Exclusive, Shared};
    let s = b.open().await;
    let (alice, bob, carol) = (name("alice"), name("bob"), name("carol"));
    let now = jiff::Timestamp::now().as_millisecond();
    let held = granted(
        s.reserve(
            alice.clone(),
            wanted(&["src/relay/**"], Exclusive, 3600),
            now,
        )
        .await
        .unwrap(),
    );
    assert_eq!(held.holder, alice);
    assert_eq!(held.expires_at.as_millisecond(), now + 3_600_000);
    // Overlapping globs: refused with the holder's reservation whole.
    let refused = conflicts(
        s.reserve(bob.clone(), wanted(&["src/*/mod.rs"], Shared, 3600), now)
            .await
            .unwrap(),
    );
    assert_eq!(refused, vec![held.clone()]);
    // Its holder never conflicts with itself; other files are free.
    granted(
        s.reserve(
            alice.clone(),
            wanted(&["src/relay/mod.rs"], Exclusive, 60),
            now,
        )
        .await
        .unwrap(),
    );
    granted(
        s.reserve(bob.clone(), wanted(&["docs/*.md"], Shared, 3600), now)
            .await
            .unwrap(),
    );
    // Shared beside shared, never beside an exclusive one.
    granted(
        s.reserve(carol.clone(), wanted(&["docs/cli.md"], Shared, 3600), now)
            .await
            .unwrap(),
    );
    let refused = conflicts(
        s.reserve(alice.clone(), wanted(&["docs/**"], Exclusive, 3600), now)
            .await
            .unwrap(),
    );
    let holders: Vec<_> = refused.iter().map(|r| r.holder.as_str()).collect();
    assert_eq!(
        holders,
        ["bob", "carol"],
        "each holder in the way, oldest first"
    );
    // Another project is another namespace.
    let mut elsewhere = wanted(&["src/relay/**"], Exclusive, 3600);
    elsewhere.project = ProjectName::new("other").unwrap();
    granted(s.reserve(bob.clone(), elsewhere, now).await.unwrap());
    let listed = s.reservations(demo(), now).await.unwrap();
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[0], held);
}

async fn reservations_lapse_and_are_released_and_renewed<B: Backend>(b: B) {
    use ReservationMode::Exclusive;
    let s = b.open().await;
    let (alice, bob) = (name("alice"), name("bob"));
    let now = jiff::Timestamp::now().as_millisecond();
    let first = granted(
        s.reserve(alice.clone(), wanted(&["a.rs"], Exclusive, 60), now)
            .await
            .unwrap(),
    );
    let minute = 60_000;
    assert_eq!(
        s.reservations(demo(), now + minute - 1)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        s.reservations(demo(), now + minute)
            .await
            .unwrap()
            .is_empty(),
        "expired ones are never shown"
    );
    assert!(
        s.renew_reserved(
            alice.clone(),
            demo(),
            vec![],
            Ttl::from_secs(60).unwrap(),
            now + minute
        )
        .await
        .unwrap()
        .is_empty(),
        "nor renewed"
    );
    // Expiry lets the other in.
    let bobs = granted(
        s.reserve(bob.clone(), wanted(&["a.rs"], Exclusive, 60), now + minute)
            .await
            .unwrap(),
    );
    // Renewal: a new expiry from now, for the holder's own only.
    let later = now + minute + 30_000;
    assert!(
        s.renew_reserved(
            alice.clone(),
            demo(),
            vec![bobs.id],
            Ttl::from_secs(60).unwrap(),
            later
        )
        .await
        .unwrap()
        .is_empty()
    );
    let renewed = s
        .renew_reserved(
            bob.clone(),
            demo(),
            vec![],
            Ttl::from_secs(120).unwrap(),
            later,
        )
        .await
        .unwrap();
    assert_eq!(renewed.len(), 1);
    assert_eq!(renewed[0].expires_at.as_millisecond(), later + 120_000);
    assert_eq!(
        s.reservations(demo(), later + 100_000).await.unwrap(),
        renewed
    );
    // Release: by id (only one's own), by pattern, all; release lets the other in.
    let at = later + 1;
    assert!(
        s.release_reserved(alice.clone(), demo(), Which::Ids(vec![bobs.id]), at)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.release_reserved(bob.clone(), demo(), Which::Ids(vec![bobs.id, first.id]), at)
            .await
            .unwrap(),
        vec![bobs.id]
    );
    let again = granted(
        s.reserve(alice.clone(), wanted(&["a.rs", "b.rs"], Exclusive, 60), at)
            .await
            .unwrap(),
    );
    let other = granted(
        s.reserve(alice.clone(), wanted(&["c.rs"], Exclusive, 60), at)
            .await
            .unwrap(),
    );
    let b_rs = Pattern::new("b.rs").unwrap();
    assert_eq!(
        s.release_reserved(alice.clone(), demo(), Which::Patterns(vec![b_rs]), at)
            .await
            .unwrap(),
        vec![again.id]
    );
    assert_eq!(
        s.release_reserved(alice.clone(), demo(), Which::All, at)
            .await
            .unwrap(),
        vec![other.id]
    );
    assert!(s.reservations(demo(), at).await.unwrap().is_empty());
}

async fn reservations_are_bounded_per_holder<B: Backend>(b: B) {
    let s = b.open().await;
    let alice = name("alice");
    let now = jiff::Timestamp::now().as_millisecond();
    for i in 0..MAX_HELD_PER_PROJECT {
        let file = format!("f{i}.rs");
        granted(
            s.reserve(
                alice.clone(),
                wanted(&[&file], ReservationMode::Shared, 60),
                now,
            )
            .await
            .unwrap(),
        );
    }
    assert_eq!(
        s.reserve(
            alice.clone(),
            wanted(&["more.rs"], ReservationMode::Shared, 60),
            now
        )
        .await
        .unwrap(),
        Reserve::TooMany {
            holders: true,
            limit: MAX_HELD_PER_PROJECT
        }
    );
    // Expired ones are not counted.
    granted(
        s.reserve(
            alice,
            wanted(&["more.rs"], ReservationMode::Shared, 60),
            now + 60_000,
        )
        .await
        .unwrap(),
    );
}

/// Two agents' reserves at once (on PostgreSQL, on two connections of the pool).
async fn two_racing_reserves_cannot_both_win<B: Backend>(b: B) {
    let s = b.open().await;
    let now = jiff::Timestamp::now().as_millisecond();
    for round in 0..10 {
        let file = format!("race{round}/**");
        let (a, b) = tokio::join!(
            s.reserve(
                name("alice"),
                wanted(&[&file], ReservationMode::Exclusive, 60),
                now
            ),
            s.reserve(
                name("bob"),
                wanted(&[&file], ReservationMode::Exclusive, 60),
                now
            ),
        );
        let wins = [a.unwrap(), b.unwrap()]
            .into_iter()
            .filter(|o| matches!(o, Reserve::Granted(_)))
            .count();
        assert_eq!(wins, 1, "round {round}");
    }
}

async fn reservations_survive_a_reopen<B: Backend>(b: B) {
    let s = b.open().await;
    let now = jiff::Timestamp::now().as_millisecond();
    let held = granted(
        s.reserve(
            name("alice"),
            wanted(&["src/**"], ReservationMode::Exclusive, 3600),
            now,
        )
        .await
        .unwrap(),
    );
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.reservations(demo(), now).await.unwrap(),
        vec![held.clone()]
    );
    assert_eq!(
        conflicts(
            s.reserve(
                name("bob"),
                wanted(&["src/lib.rs"], ReservationMode::Shared, 60),
                now
            )
            .await
            .unwrap()
        ),
        vec![held]
    );
}

fn team(creator: &AgentName, owner: OwnerKey) -> GroupView {
    GroupView {
        name: name("team"),
        creator: creator.clone(),
        owner,
        policy: GroupPolicy::Members,
        members: vec![Address::local(creator.clone())],
    }
}

async fn a_group_shares_the_agents_namespace<B: Backend>(b: B) {
    let s = b.open().await;
    let [lead] = agents(&s, &["lead"]).await.try_into().unwrap();
    let owner = OwnerKey::from_bytes([9; 32]);
    assert_eq!(
        s.create_group(team(&lead, owner), 10).await.unwrap(),
        GroupCreation::Created
    );
    assert_eq!(
        s.create_group(team(&lead, owner), 10).await.unwrap(),
        GroupCreation::NameTaken,
        "a group's name twice"
    );
    assert_eq!(
        s.register(name("team"), keys(), None).await.unwrap(),
        Registration::NameTaken,
        "an agent under a group's name"
    );
    let mut squatter = team(&lead, owner);
    squatter.name = lead.clone();
    assert_eq!(
        s.create_group(squatter, 10).await.unwrap(),
        GroupCreation::NameTaken,
        "a group under an agent's name"
    );
    // One creator makes at most `max` groups.
    let mut second = team(&lead, owner);
    second.name = name("second");
    assert_eq!(
        s.create_group(second.clone(), 1).await.unwrap(),
        GroupCreation::TooMany
    );
    assert_eq!(
        s.create_group(second, 2).await.unwrap(),
        GroupCreation::Created
    );
    // Durable, with its creator as its first member, and no keys of its own.
    drop(s);
    let s = b.open().await;
    assert_eq!(
        s.group(name("team")).await.unwrap(),
        Some(team(&lead, owner))
    );
    assert_eq!(s.keys(name("team")).await.unwrap(), None);
    assert_eq!(s.group(name("nobody")).await.unwrap(), None);
}

async fn a_roster_keeps_its_order_and_its_bound<B: Backend>(b: B) {
    let s = b.open().await;
    let [lead, bob, carol] = agents(&s, &["lead", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    let owner = OwnerKey::from_bytes([9; 32]);
    s.create_group(team(&lead, owner), 10).await.unwrap();
    let far = addr("dave@relay-b.example");
    for member in [Address::local(bob.clone()), far.clone()] {
        assert!(matches!(
            s.add_member(name("team"), member, 3).await.unwrap(),
            RosterChange::Changed(_)
        ));
    }
    let RosterChange::Unchanged(view) = s
        .add_member(name("team"), Address::local(bob.clone()), 3)
        .await
        .unwrap()
    else {
        panic!("adding a member twice changes nothing");
    };
    assert_eq!(
        view.members,
        [
            Address::local(lead.clone()),
            Address::local(bob.clone()),
            far.clone()
        ]
    );
    assert_eq!(
        s.add_member(name("team"), Address::local(carol.clone()), 3)
            .await
            .unwrap(),
        RosterChange::Full,
        "the bound holds"
    );
    assert_eq!(
        s.add_member(name("other"), Address::local(carol.clone()), 3)
            .await
            .unwrap(),
        RosterChange::NoGroup
    );
    assert!(matches!(
        s.remove_member(name("team"), Address::local(bob.clone())).await.unwrap(),
        RosterChange::Changed(v) if v.members == [Address::local(lead.clone()), far.clone()]
    ));
    assert!(matches!(
        s.remove_member(name("team"), Address::local(bob.clone()))
            .await
            .unwrap(),
        RosterChange::Unchanged(_)
    ));
    // Listed for a member and for the owner's other agents, not for anyone else.
    let listed = |who: &AgentName, owner| s.groups_of(Address::local(who.clone()), owner, 10);
    assert_eq!(listed(&lead, None).await.unwrap().len(), 1);
    assert_eq!(listed(&carol, Some(owner)).await.unwrap().len(), 1);
    assert!(listed(&carol, None).await.unwrap().is_empty());
    assert!(
        listed(&bob, Some(OwnerKey::from_bytes([1; 32])))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.groups_of(far.clone(), None, 10).await.unwrap()[0].members,
        [Address::local(lead.clone()), far]
    );
}

fn group_copies(to: &[&AgentName], body: &str) -> Vec<QueuedCopy> {
    copies(to, body)
        .into_iter()
        .map(|c| QueuedCopy {
            group: Some(name("team")),
            ..c
        })
        .collect()
}

async fn a_group_copy_needs_its_member_to_have_joined<B: Backend>(b: B) {
    let s = b.open().await;
    let [lead, bob, carol, dave] = agents(&s, &["lead", "bob", "carol", "dave"])
        .await
        .try_into()
        .unwrap();
    let send = |to: Vec<QueuedCopy>| {
        s.accept(
            lead.clone(),
            MessageId::new(),
            to,
            ROOMY,
            far_future(),
            Policy::Open,
        )
    };
    // Nobody joined: under an open policy too, nothing is stored, and nothing is refused.
    assert_eq!(
        send(group_copies(&[&bob, &carol], "a")).await.unwrap(),
        Accepted::Fanned {
            stored: vec![],
            skipped: vec![bob.clone(), carol.clone()]
        }
    );
    for member in [&bob, &carol, &dave] {
        let join = ConsentChange::Join {
            owner: member.clone(),
            group: name("team"),
        };
        assert_eq!(
            s.consent(join).await.unwrap(),
            ConsentOutcome::Applied(None)
        );
    }
    // carol blocks the sender, dave is closed: only bob's copy is stored.
    let block = ConsentChange::Block {
        owner: carol.clone(),
        peer: lead.clone(),
    };
    s.consent(block).await.unwrap();
    let closed = ConsentChange::SetPolicy {
        owner: dave.clone(),
        policy: Policy::Closed,
    };
    s.consent(closed).await.unwrap();
    assert_eq!(
        send(group_copies(&[&bob, &carol, &dave], "b"))
            .await
            .unwrap(),
        Accepted::Fanned {
            stored: vec![bob.clone()],
            skipped: vec![carol.clone(), dave.clone()]
        }
    );
    // Joining is consent to the group, not to its members one by one: a plain send from
    // lead to bob under `contacts` is still refused.
    let strict = ConsentChange::SetPolicy {
        owner: bob.clone(),
        policy: Policy::Contacts,
    };
    s.consent(strict).await.unwrap();
    assert_eq!(
        send(copies(&[&bob], "c")).await.unwrap(),
        Accepted::NotAllowed(bob.clone())
    );
    assert!(matches!(
        send(group_copies(&[&bob], "d")).await.unwrap(),
        Accepted::Fanned { stored, .. } if stored == [bob.clone()]
    ));
    // Leaving (the contact row removed) stops the group's copies.
    let leave = ConsentChange::Remove {
        owner: bob.clone(),
        peer: name("team"),
    };
    assert_eq!(
        s.consent(leave).await.unwrap(),
        ConsentOutcome::Applied(None)
    );
    assert_eq!(
        send(group_copies(&[&bob], "e")).await.unwrap(),
        Accepted::Fanned {
            stored: vec![],
            skipped: vec![bob.clone()]
        }
    );
    let waiting = s.pending(bob.clone(), 0, 10).await.unwrap();
    assert_eq!(waiting.len(), 2, "copies b and d only");
}

/// A stored name for `name@host`, as a relay keeps another relay's agents and groups.
fn remote(address: &str) -> AgentName {
    AgentName::remote_agent(&addr(address)).unwrap()
}

async fn another_relays_group_copies_cross_its_mailbox_and_meet_its_members_consent<B: Backend>(
    b: B,
) {
    let s = b.open().await;
    let [lead, bob, carol, dave] = agents(&s, &["lead", "bob", "carol", "dave"])
        .await
        .try_into()
        .unwrap();
    // On the group's relay: a member's copy for another relay waits in its mailbox, past
    // consent, byte for byte (the group rides in the bytes).
    let relay_b = mailbox("relay-b");
    let waiting = group_copy(&addr("team@relay-a"), br#"{"v":1,"to":"erin@relay-b"}"#);
    let queued = QueuedCopy {
        id: Some(MessageId::new()),
        recipient: relay_b.clone(),
        envelope: Arc::from(waiting.clone()),
        group: Some(name("team")),
    };
    assert_eq!(
        s.accept(
            lead.clone(),
            MessageId::new(),
            vec![queued],
            ROOMY,
            far_future(),
            Policy::Contacts,
        )
        .await
        .unwrap(),
        Accepted::Fanned {
            stored: vec![relay_b.clone()],
            skipped: vec![]
        }
    );
    let read = s.pending(relay_b, 0, 10).await.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].envelope, waiting);
    assert_eq!(
        read_link_copy(&read[0].envelope).unwrap().1,
        Some(addr("team@relay-a"))
    );

    // On the member's relay: the copy of `team@relay-a` from `alice@relay-a` passes each
    // member's consent as that group's.
    let (team_a, alice_a) = (remote("team@relay-a"), remote("alice@relay-a"));
    for member in [&bob, &carol] {
        let join = ConsentChange::Join {
            owner: member.clone(),
            group: team_a.clone(),
        };
        assert_eq!(
            s.consent(join).await.unwrap(),
            ConsentOutcome::Applied(None)
        );
    }
    let block = ConsentChange::Block {
        owner: carol.clone(),
        peer: alice_a.clone(),
    };
    s.consent(block).await.unwrap();
    let copies_of_team_a = copies(&[&bob, &carol, &dave], "across")
        .into_iter()
        .map(|c| QueuedCopy {
            group: Some(team_a.clone()),
            ..c
        })
        .collect();
    assert_eq!(
        s.accept(
            alice_a,
            MessageId::new(),
            copies_of_team_a,
            ROOMY,
            far_future(),
            Policy::Open,
        )
        .await
        .unwrap(),
        Accepted::Fanned {
            stored: vec![bob.clone()],
            skipped: vec![carol, dave],
        },
        "bob joined; carol blocks the sender; dave never joined, under an open default too"
    );
    assert_eq!(s.pending(bob, 0, 10).await.unwrap().len(), 1);
}

/// Every case, as a test per backend: `sqlite::CASE` and `postgres::CASE`.
/// Every case, as a test per backend: `sqlite::CASE` and `postgres::CASE`.
macro_rules! contract {
    ($($case:ident),+ $(,)?) => {
        contract!(@backend sqlite, Sqlite, $($case),+);
        contract!(@backend postgres, Postgres, $($case),+);
    };
    (@backend $module:ident, $backend:ident, $($case:ident),+) => {
        mod $module {
            use super::{$backend, Backend};
            $(
                #[tokio::test]
                async fn $case() {
                    if let Some(b) = $backend::fresh(stringify!($case)).await {
                        super::$case(b).await;
                    }
                }
            )+
        }
    };
}

contract!(
    registration_is_first_come,
    an_invite_registers_one_name,
    the_owner_key_is_compare_and_set,
    copies_are_kept_in_order_per_recipient_until_acked,
    a_resend_is_stored_once_per_recipient,
    a_full_queue_refuses_the_whole_send,
    consent_is_checked_inside_the_write,
    a_replaced_session_cannot_ack,
    expired_copies_go,
    copy_statuses_say_queued_bounced_or_gone,
    keys_rotate_only_from_the_registered_ones,
    a_retired_name_is_held_then_free,
    a_relay_mailbox_takes_mail_past_consent_and_keeps_its_name,
    expiry_leaves_relay_mailboxes_to_their_link,
    bounces_a_link_records_are_kept_once,
    a_relay_key_is_pinned_on_first_contact,
    the_operator_lists_removes_and_replaces_relay_pins,
    the_relays_own_key_is_recorded_once,
    mail_from_another_relay_meets_its_recipients_consent,
    open_requests_are_bounded_per_target_and_per_relay,
    a_block_of_a_whole_relay_refuses_its_agents_unless_one_is_a_contact,
    a_denial_is_kept_for_its_requester_and_taken_once,
    reservations_conflict_by_mode_and_holder,
    reservations_lapse_and_are_released_and_renewed,
    reservations_are_bounded_per_holder,
    two_racing_reserves_cannot_both_win,
    reservations_survive_a_reopen,
    a_group_shares_the_agents_namespace,
    a_roster_keeps_its_order_and_its_bound,
    a_group_copy_needs_its_member_to_have_joined,
    another_relays_group_copies_cross_its_mailbox_and_meet_its_members_consent,
);

// PostgreSQL's own cases: several nodes on one database.

/// Two nodes (two connections to one database) of a fresh PostgreSQL backend.
async fn two_nodes(test: &str) -> Option<(Postgres, PostgresStorage, PostgresStorage)> {
    let backend = Postgres::fresh(test).await?;
    let (a, b) = (backend.open().await, backend.open().await);
    assert_ne!(a.node_id(), b.node_id(), "each node has its own id");
    assert_eq!(a.relay_id(), b.relay_id(), "the relay id is shared");
    Some((backend, a, b))
}

#[tokio::test]
async fn postgres_a_replaced_lease_fences_the_old_sessions_acks() {
    let Some((_db, a, b)) = two_nodes("lease").await else {
        return;
    };
    let [alice, bob, carol] = agents(&a, &["alice", "bob", "carol"])
        .await
        .try_into()
        .unwrap();
    for body in ["one", "two"] {
        let sent = a
            .accept(
                alice.clone(),
                MessageId::new(),
                copies(&[&bob], body),
                ROOMY,
                far_future(),
                Policy::Open,
            )
            .await
            .unwrap();
        assert!(matches!(sent, Accepted::Stored(_)), "{sent:?}");
    }
    let queued = a.pending(bob.clone(), 0, 10).await.unwrap();
    let first = a.claim(bob.clone(), Shown::Online).await.unwrap();
    // bob's session moves to the other node.
    let second = b.claim(bob.clone(), Shown::Online).await.unwrap();
    assert!(second > first, "{first} then {second}");
    assert_eq!(
        a.ack(bob.clone(), queued[0].seq, first).await.unwrap(),
        AckOutcome::Fenced,
        "the replaced session's ack is refused"
    );
    assert_eq!(
        a.waiting(bob.clone()).await.unwrap(),
        2,
        "and deleted nothing"
    );
    assert_eq!(
        b.ack(bob.clone(), queued[0].seq, second).await.unwrap(),
        AckOutcome::Applied(1)
    );
    assert_eq!(a.waiting(bob.clone()).await.unwrap(), 1);
    assert_eq!(
        b.ack(carol, 1, Epoch::new(1)).await.unwrap(),
        AckOutcome::Fenced,
        "no lease, no ack"
    );
}

/// A test envelope's body, `<tag><n>`: the tag and the number.
fn tagged(envelope: &[u8]) -> (char, u64) {
    let text = String::from_utf8_lossy(envelope);
    let start = text.find("\"body\":\"").expect("a body") + 8;
    let body = text[start..].split('"').next().expect("a closed body");
    let mut chars = body.chars();
    let tag = chars.next().expect("a tag");
    (tag, chars.as_str().parse().expect("a number after the tag"))
}

/// A transaction whose statements go out with their `COMMIT` (a batch's writes, an ack) and
/// fails on the way changes nothing, answers with the server's error, and leaves no connection
/// inside a transaction: the sends and acks after it, on the same pooled connections, work.
#[tokio::test]
async fn postgres_a_write_that_fails_before_its_commit_changes_nothing() {
    let Some(db) = Postgres::fresh("failed_write").await else {
        return;
    };
    let s = db.open().await;
    // Another node reads: it sees only what committed.
    let reader = db.open().await;
    let [alice, bob] = agents(&s, &["alice", "bob"]).await.try_into().unwrap();
    let client = db.client().await;
    let refuse = |table: &str| {
        format!(
            "CREATE FUNCTION refuse_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON {table}
                 FOR EACH ROW EXECUTE FUNCTION refuse_{table}();"
        )
    };
    let send = |body: &str| {
        s.accept(
            alice.clone(),
            MessageId::new(),
            copies(&[&bob], body),
            ROOMY,
            far_future(),
            Policy::Open,
        )
    };
    // A batch's copy is refused by the database: the send fails, nothing is numbered.
    client.batch_execute(&refuse("queue")).await.unwrap();
    let e = send("refused").await.unwrap_err();
    assert!(e.to_string().contains("refused by the test"), "{e}");
    client
        .batch_execute("DROP TRIGGER refuse ON queue")
        .await
        .unwrap();
    // More sends than the pool has connections, one after the other, so the one that
    // failed is used again: numbering starts at 1.
    for i in 0..20 {
        let sent = send(&format!("m{i}")).await.unwrap();
        assert_eq!(sent, Accepted::Stored(vec![bob.clone()]));
    }
    let queued = reader.pending(bob.clone(), 0, 100).await.unwrap();
    let seqs: Vec<Seq> = queued.iter().map(|q| q.seq).collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<Seq>>());
    assert_eq!(reader.waiting(bob.clone()).await.unwrap(), 20);
    // An ack whose delete is refused (its keys kept for duplicates cannot be written): the
    // copies stay, counted.
    let epoch = s.claim(bob.clone(), Shown::Online).await.unwrap();
    client.batch_execute(&refuse("acked_copies")).await.unwrap();
    let e = s.ack(bob.clone(), 5, epoch).await.unwrap_err();
    assert!(e.to_string().contains("refused by the test"), "{e}");
    assert_eq!(reader.waiting(bob.clone()).await.unwrap(), 20);
    assert_eq!(reader.pending(bob.clone(), 0, 100).await.unwrap().len(), 20);
    client
        .batch_execute("DROP TRIGGER refuse ON acked_copies")
        .await
        .unwrap();
    for upto in 1..=20 {
        s.ack(bob.clone(), upto, epoch).await.unwrap();
    }
    assert_eq!(reader.waiting(bob.clone()).await.unwrap(), 0);
    assert_eq!(
        send("after").await.unwrap(),
        Accepted::Stored(vec![bob.clone()])
    );
    assert_eq!(reader.pending(bob, 0, 10).await.unwrap()[0].seq, 21);
}

/// A batch's duplicate check looks up its own keys in the queue's index, however much the
/// queue grew after the node planned its statements: a node plans each once per connection
/// (generic plans), and a plan made while the queue was empty once hashed the whole queue at
/// every batch. PostgreSQL's counters of index entries read tell which it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_batch_reads_its_own_keys_not_the_whole_queue() {
    const GROWN: i64 = 5_000;
    let Some(db) = Postgres::fresh("keys_probed").await else {
        return;
    };
    let s = db.open().await;
    let [alice, bob] = agents(&s, &["alice", "bob"]).await.try_into().unwrap();
    let client = db.client().await;
    let send = |body: String| {
        s.accept(
            alice.clone(),
            MessageId::new(),
            copies(&[&bob], &body),
            ROOMY,
            far_future(),
            Policy::Open,
        )
    };
    // Planned while the queue is empty.
    for i in 0..3 {
        send(format!("early {i}")).await.unwrap();
    }
    // The queue grows behind the node's back: copies for someone else.
    client
        .execute(
            "INSERT INTO queue (recipient, seq, sender, message_id, envelope, size, accepted_at, expires_at)
             SELECT 'carol', g, 'dave', 'm' || g, '\\x00', 1, 0, $1 FROM generate_series(1, $2::bigint) g",
            &[&far_future(), &GROWN],
        )
        .await
        .unwrap();
    for i in 0..3 {
        send(format!("late {i}")).await.unwrap();
    }
    // Index entries read in the queue, once the counters show every row inserted: a backend
    // reports its counters a while after its transaction, not at once.
    let read: i64 = common::wait_until(
        std::time::Duration::from_secs(30),
        "the queue's counters show every row inserted",
        async || {
            let row = client
                .query_one(
                    "SELECT (SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
                             WHERE relname = 'queue'),
                            (SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'queue')",
                    &[],
                )
                .await
                .unwrap();
            let (read, inserted): (i64, i64) = (row.get(0), row.get(1));
            (inserted >= GROWN + 6).then_some(read)
        },
    )
    .await;
    assert!(
        read < GROWN,
        "six sends read {read} entries of the queue's indexes, which hold {GROWN} other copies"
    );
    assert_eq!(s.waiting(bob).await.unwrap(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_sending_to_one_recipient_keep_its_numbers_in_order() {
    const PER_NODE: u64 = 150;
    let Some((db, a, b)) = two_nodes("two_nodes_order").await else {
        return;
    };
    let names = agents(&a, &["alice", "carol", "bob", "dave"]).await;
    let (bob, dave) = (names[2].clone(), names[3].clone());
    // Each node sends from its own agent, every message to bob and every other one to dave
    // too, all queued at once so that they commit in batches that overlap the other node's.
    let send_all = |node: Arc<PostgresStorage>, sender: AgentName, tag: char| {
        let (bob, dave) = (bob.clone(), dave.clone());
        tokio::spawn(async move {
            let pending: Vec<_> = (0..PER_NODE)
                .map(|i| {
                    let to = if i % 2 == 0 {
                        vec![&bob, &dave]
                    } else {
                        vec![&bob]
                    };
                    node.accept(
                        sender.clone(),
                        MessageId::new(),
                        copies(&to, &format!("{tag}{i}")),
                        ROOMY,
                        far_future(),
                        Policy::Open,
                    )
                })
                .collect();
            for p in pending {
                let sent = p.await.unwrap();
                assert!(matches!(sent, Accepted::Stored(_)), "{sent:?}");
            }
        })
    };
    let writers = [
        send_all(Arc::new(a), names[0].clone(), 'a'),
        send_all(Arc::new(b), names[1].clone(), 'c'),
    ];
    // A third node reads bob's queue while the writes commit: every number it sees is the
    // next one, never one past a number still to commit; and each node's sends come in the
    // order they were made.
    let reader = db.open().await;
    let mut last: Seq = 0;
    let mut next_of: HashMap<char, u64> = HashMap::new();
    let read_all = async {
        while last < 2 * PER_NODE {
            for q in reader.pending(bob.clone(), last, 64).await.unwrap() {
                assert_eq!(q.seq, last + 1, "bob's numbers skipped one after {last}");
                last = q.seq;
                let (tag, n) = tagged(&q.envelope);
                let expected = next_of.entry(tag).or_insert(0);
                assert_eq!(n, *expected, "{tag}'s sends out of call order");
                *expected += 1;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), read_all)
        .await
        .expect("bob's mail was read in time");
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(reader.waiting(bob).await.unwrap(), 2 * PER_NODE);
    let dave_seqs: Vec<Seq> = reader
        .pending(dave, 0, 1000)
        .await
        .unwrap()
        .iter()
        .map(|q| q.seq)
        .collect();
    assert_eq!(
        dave_seqs,
        (1..=PER_NODE).collect::<Vec<_>>(),
        "dave's numbers rise without gaps too"
    );
}

#[tokio::test]
async fn postgres_commits_notify_other_nodes() {
    use futures_util::StreamExt;
    let Some((db, a, _b)) = two_nodes("notify").await else {
        return;
    };
    let [alice, bob] = agents(&a, &["alice", "bob"]).await.try_into().unwrap();
    let (client, mut connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (heard, mut notes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = heard.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    client
        .batch_execute("LISTEN mailslot_wake; LISTEN mailslot_lease")
        .await
        .unwrap();
    let mut next = async || {
        let (channel, payload) =
            tokio::time::timeout(std::time::Duration::from_secs(20), notes.recv())
                .await
                .expect("a notification in time")
                .expect("the listener runs");
        (
            channel,
            serde_json::from_str::<serde_json::Value>(&payload).unwrap(),
        )
    };
    a.accept(
        alice,
        MessageId::new(),
        copies(&[&bob], "x"),
        ROOMY,
        far_future(),
        Policy::Open,
    )
    .await
    .unwrap();
    let seq = a.pending(bob.clone(), 0, 1).await.unwrap()[0].seq;
    let (channel, wake) = next().await;
    assert_eq!(channel, "mailslot_wake");
    assert_eq!(wake["recipient"], "bob");
    assert_eq!(wake["seq"], seq);
    assert_eq!(wake["node"], a.node_id());
    let epoch = a.claim(bob, Shown::Online).await.unwrap();
    let (channel, lease) = next().await;
    assert_eq!(channel, "mailslot_lease");
    assert_eq!(lease["agent"], "bob");
    assert_eq!(lease["epoch"], epoch.get());
    assert_eq!(lease["node"], a.node_id());
}

#[tokio::test]
async fn postgres_expiry_runs_on_one_node_at_a_time() {
    let Some((db, a, b)) = two_nodes("expiry").await else {
        return;
    };
    let [alice, bob] = agents(&a, &["alice", "bob"]).await.try_into().unwrap();
    let now = jiff::Timestamp::now().as_millisecond();
    for _ in 0..3 {
        a.accept(
            alice.clone(),
            MessageId::new(),
            copies(&[&bob], "soon"),
            ROOMY,
            now + 1_000,
            Policy::Open,
        )
        .await
        .unwrap();
    }
    // Another node holds the expiry lock (as in the middle of its own expiry): this one
    // leaves the work to it.
    let (mut client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let other = client.transaction().await.unwrap();
    let key: i64 = 0x6578_7069_7279;
    other
        .execute("SELECT pg_advisory_xact_lock($1)", &[&key])
        .await
        .unwrap();
    assert!(b.expire(now + 2_000).await.unwrap().is_empty());
    assert_eq!(b.waiting(bob.clone()).await.unwrap(), 3);
    other.commit().await.unwrap();
    // Both at once: the copies go once, counted once.
    let (x, y) = tokio::join!(a.expire(now + 2_000), b.expire(now + 2_000));
    assert_eq!(
        x.unwrap().len() + y.unwrap().len(),
        3,
        "each copy bounces once"
    );
    assert_eq!(a.waiting(bob.clone()).await.unwrap(), 0);
    assert!(a.pending(bob, 0, 10).await.unwrap().is_empty());
}

/// A SQLite relay's relay mailboxes, the bounces its links recorded and its pinned relay keys
/// go with it to PostgreSQL (`relay migrate`), a mailbox's copy past its expiry included: its
/// link, not the move, bounces it.
#[tokio::test]
async fn sqlite_relay_mailboxes_bounces_and_pins_move_to_postgres() {
    let backend = Sqlite::new();
    let db = backend.db();
    let s = backend.open().await;
    let [alice] = agents(&s, &["alice"]).await.try_into().unwrap();
    let relay_b = mailbox("relay-b");
    let now = jiff::Timestamp::now().as_millisecond();
    for expires in [now - 1_000, far_future()] {
        let stored = s
            .accept(
                alice.clone(),
                MessageId::new(),
                copies(&[&relay_b], "remote"),
                ROOMY,
                expires,
                Policy::Open,
            )
            .await
            .unwrap();
        assert!(matches!(stored, Accepted::Stored(_)), "{stored:?}");
    }
    let bounce = Bounce {
        id: MessageId::new(),
        to: addr("bob@relay-b"),
        expired_at: jiff::Timestamp::from_millisecond(now).unwrap(),
    };
    s.record_bounces(alice.clone(), vec![bounce.clone()])
        .await
        .unwrap();
    let key = RelayKey::from_bytes([7; 32]);
    let relay = RelayName::new("relay-b").unwrap();
    s.pin_relay(relay.clone(), key).await.unwrap();
    drop(s);

    let snapshot = SqliteStorage::export(&db).unwrap();
    assert_eq!(snapshot.bounces, vec![(alice.clone(), bounce.clone())]);
    assert_eq!(snapshot.relay_pins.len(), 1);
    assert_eq!(
        (&snapshot.relay_pins[0].relay, snapshot.relay_pins[0].key),
        (&relay, key)
    );
    let waiting: Vec<AgentName> = snapshot
        .copies
        .flat_map(|chunk| chunk.unwrap())
        .map(|c| c.recipient)
        .collect();
    assert_eq!(waiting, vec![relay_b.clone(), relay_b.clone()]);

    let Some(cluster) = pg::PgCluster::shared() else {
        return;
    };
    let url = cluster.create_database("relay_mailboxes_migrate").await;
    let moved = mailslot::relay::migrate(&db, &url).await.unwrap();
    assert_eq!((moved.copies, moved.bounces, moved.relay_pins), (2, 1, 1));
    let pg = PostgresStorage::connect(&url).await.unwrap();
    assert_eq!(pg.pending(relay_b, 0, 10).await.unwrap().len(), 2);
    assert_eq!(pg.bounces(alice, 10).await.unwrap(), vec![bounce]);
    assert_eq!(pg.pin_relay(relay, key).await.unwrap(), RelayPin::Matches);
}
