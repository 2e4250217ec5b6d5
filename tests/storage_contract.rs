//! The relay storage contract: what every backend of `relay::storage::Storage` must do, written
//! once against the trait and run for each backend (SQLite today; PostgreSQL joins with
//! issue 15). Each case opens a fresh store through a [`Backend`], which can also reopen the
//! same data, so durability is part of the contract.

use std::sync::Arc;

use mailslot::crypto::{Identity, Owner};
use mailslot::protocol::{AgentName, MessageId, Policy, PublicKeys, RequestCode};
use mailslot::relay::storage::{
    Accepted, AckOutcome, ConsentChange, ConsentLedger, ConsentOutcome, Copy, Queue, Quota,
    Registration, Registry, SqliteStorage, Storage,
};

/// A backend under test: a fresh, empty store, and the same data opened again.
trait Backend {
    type S: Storage;
    fn open(&self) -> Self::S;
}

struct Sqlite(tempfile::TempDir);

impl Sqlite {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }
}

impl Backend for Sqlite {
    type S = SqliteStorage;
    fn open(&self) -> SqliteStorage {
        SqliteStorage::open(&self.0.path().join("relay.db")).unwrap()
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

fn copies(to: &[&AgentName], body: &str) -> Vec<Copy> {
    to.iter()
        .map(|r| Copy {
            recipient: (*r).clone(),
            envelope: Arc::from(format!("{{\"to\":\"{r}\",\"body\":\"{body}\"}}").into_bytes()),
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
    let s = b.open();
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
    let s = b.open();
    assert_eq!(s.keys(name("alice")).await.unwrap(), Some(alice), "durable");
}

async fn an_invite_registers_one_name<B: Backend>(b: B, add: impl Fn(&[[u8; 32]])) {
    let digest = mailslot::crypto::digest(b"msi_token");
    add(&[digest]);
    let s = b.open();
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
    let s = b.open();
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
    let s = b.open();
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
    let lease = s.claim(bob.clone()).await.unwrap();
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
    let s = b.open();
    assert_eq!(s.waiting(bob.clone()).await.unwrap(), 2, "acks are durable");
    let again = s.pending(bob, 0, 100).await.unwrap();
    assert_eq!(
        again.iter().map(|q| q.seq).collect::<Vec<_>>(),
        vec![bobs[3].seq, bobs[4].seq]
    );
}

async fn a_resend_is_stored_once_per_recipient<B: Backend>(b: B) {
    let s = b.open();
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
    let s = b.open();
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
    let s = b.open();
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
    let s = b.open();
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
    let first = s.claim(bob.clone()).await.unwrap();
    let second = s.claim(bob.clone()).await.unwrap();
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
    let alices = s.claim(alice.clone()).await.unwrap();
    assert_eq!(
        s.ack(bob.clone(), queued[1].seq, second).await.unwrap(),
        AckOutcome::Applied(1),
        "alice's claim ({alices}) did not fence bob"
    );
}

async fn expired_copies_go<B: Backend>(b: B) {
    let s = b.open();
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
    assert_eq!((bounced[0].1.id, &bounced[0].1.to), (soon, &bob));
    let left = s.pending(bob.clone(), 0, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert!(String::from_utf8_lossy(&left[0].envelope).contains("later"));
    assert!(s.expire(now + 2_000).await.unwrap().is_empty(), "once");

    // The bounce waits for its sender, durably, until the sender acknowledges it.
    drop(s);
    let s = b.open();
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

async fn a_retired_name_is_held_then_free<B: Backend>(b: B) {
    let s = b.open();
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

macro_rules! contract {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn registration_is_first_come() {
                super::registration_is_first_come($make).await;
            }
            #[tokio::test]
            async fn the_owner_key_is_compare_and_set() {
                super::the_owner_key_is_compare_and_set($make).await;
            }
            #[tokio::test]
            async fn copies_are_kept_in_order_per_recipient_until_acked() {
                super::copies_are_kept_in_order_per_recipient_until_acked($make).await;
            }
            #[tokio::test]
            async fn a_resend_is_stored_once_per_recipient() {
                super::a_resend_is_stored_once_per_recipient($make).await;
            }
            #[tokio::test]
            async fn a_full_queue_refuses_the_whole_send() {
                super::a_full_queue_refuses_the_whole_send($make).await;
            }
            #[tokio::test]
            async fn consent_is_checked_inside_the_write() {
                super::consent_is_checked_inside_the_write($make).await;
            }
            #[tokio::test]
            async fn a_replaced_session_cannot_ack() {
                super::a_replaced_session_cannot_ack($make).await;
            }
            #[tokio::test]
            async fn expired_copies_go() {
                super::expired_copies_go($make).await;
            }
            #[tokio::test]
            async fn a_retired_name_is_held_then_free() {
                super::a_retired_name_is_held_then_free($make).await;
            }
        }
    };
}

contract!(sqlite, Sqlite::new());

#[tokio::test]
async fn sqlite_an_invite_registers_one_name() {
    let backend = Sqlite::new();
    drop(backend.open()); // the schema exists before the operator makes invites
    let db = backend.0.path().join("relay.db");
    an_invite_registers_one_name(backend, |digests| {
        SqliteStorage::add_invites(&db, digests).unwrap()
    })
    .await;
}
