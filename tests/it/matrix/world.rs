//! The world the views are checked against: relays A and B on one backend, and alice's store
//! holding mail of every kind (made in `cast.rs`).

use std::path::{Path, PathBuf};

use mailslot::client::RelayUrl;
use mailslot::protocol::{Message, RelayName};
use mailslot::relay::RelayConfig;
use mailslot::store::SentState;

use super::Backend;
use super::cast::{Cast, settle};
use super::kinds::{Kind, Side};
use crate::common::postgres::PgCluster;
use crate::common::{TestRelay, free_loopback_addr};

/// Relays A (alice's) and B. With PostgreSQL, A is two nodes on one database (alice on the
/// first, pete on the second); with SQLite, one relay.
pub(crate) struct Relays {
    pub(crate) a: TestRelay,
    a2: Option<TestRelay>,
    pub(crate) b: TestRelay,
    /// How another node of A starts (PostgreSQL).
    node: Option<PgNode>,
    /// The node that takes mail with a short TTL, once [`Relays::expiring`] started it.
    short_ttl: Option<TestRelay>,
}

/// Another node of A: its database, the key every node shares, the name they all publish.
#[derive(Clone)]
struct PgNode {
    db: String,
    key: PathBuf,
    host: RelayName,
}

impl PgNode {
    async fn start(&self, tweak: impl FnOnce(&mut RelayConfig)) -> TestRelay {
        let node = self.clone();
        TestRelay::start(move |c| {
            c.db = Some(node.db.into());
            c.identity = Some(node.key);
            c.host = Some(node.host);
            tweak(c);
        })
        .await
    }
}

fn short_ttl(c: &mut RelayConfig) {
    c.ttl_secs = 1;
    c.expiry_interval_secs = 1;
}

impl Relays {
    /// `None` when PostgreSQL is wanted and not installed (the test skips; CI requires it).
    async fn start(backend: Backend, keys: &Path) -> Option<Self> {
        match backend {
            Backend::Sqlite => Some(Self {
                a: TestRelay::start(|_| {}).await,
                a2: None,
                b: TestRelay::start(|_| {}).await,
                node: None,
                short_ttl: None,
            }),
            Backend::Postgres => {
                let cluster = PgCluster::shared()?;
                let (db_a, db_b) = (
                    cluster.create_database("matrix_a").await,
                    cluster.create_database("matrix_b").await,
                );
                // Every node of A answers under the first one's address, with one key.
                let first = free_loopback_addr();
                let node = PgNode {
                    db: db_a,
                    key: keys.join("relay-a.key"),
                    host: RelayName::new(&first.to_string()).unwrap(),
                };
                let a = node.start(|c| c.listen = first).await;
                let a2 = node.start(|_| {}).await;
                assert_eq!(a.relay.name(), a2.relay.name());
                let b = TestRelay::start(move |c| c.db = Some(db_b.into())).await;
                Some(Self {
                    a,
                    a2: Some(a2),
                    b,
                    node: Some(node),
                    short_ttl: None,
                })
            }
        }
    }

    /// The node pete uses: A's second node, or A itself on SQLite.
    pub(crate) fn a2(&self) -> &TestRelay {
        self.a2.as_ref().unwrap_or(&self.a)
    }

    /// Makes A take mail with a one-second TTL from now on: a node of its own on PostgreSQL,
    /// A restarted on SQLite (so do this last).
    async fn expiring(self) -> Self {
        match &self.node {
            Some(node) => {
                let short = node.start(short_ttl).await;
                Self {
                    short_ttl: Some(short),
                    ..self
                }
            }
            None => {
                let Self { a, a2, b, node, .. } = self;
                let a = a.stop().await.restart_with(short_ttl).await;
                Self {
                    a,
                    a2,
                    b,
                    node,
                    short_ttl: None,
                }
            }
        }
    }

    fn short_ttl_url(&self) -> &RelayUrl {
        &self.short_ttl.as_ref().unwrap_or(&self.a).url
    }

    pub(crate) async fn shutdown(self) {
        for relay in [Some(self.a), self.a2, Some(self.b), self.short_ttl]
            .into_iter()
            .flatten()
        {
            relay.relay.shutdown().await;
        }
    }
}

pub(crate) struct World {
    pub(crate) relays: Relays,
    pub(crate) kinds: Vec<Kind>,
    /// alice, and the others (their homes stay while the views are checked).
    pub(crate) cast: Cast,
}

impl World {
    /// The world on `backend` (A's key kept in `keys`); `None` when PostgreSQL is wanted and
    /// not installed.
    pub(crate) async fn build(backend: Backend, keys: &Path) -> Option<Self> {
        let relays = Relays::start(backend, keys).await?;
        let cast = Cast::register(&relays).await;
        let mut kinds = Vec::new();
        cast.mail_in(&relays, &mut kinds).await;
        cast.mail_out(&relays, &mut kinds).await;
        cast.owner_tells(&mut kinds).await;

        // Last (it restarts A on SQLite): a copy that expires undelivered at A.
        let relays = relays.expiring().await;
        let to_dan = Message::new(
            cast.alice.address(),
            vec![cast.dan.address()],
            Kind::subject_with("zbouncedout"),
            "nobody fetches it",
        );
        let report = cast
            .alice
            .send_url(relays.short_ttl_url(), to_dan.clone())
            .await;
        assert_eq!(report.sent, [to_dan.id], "{report:?}");
        let bounced = Kind::new("bounced locally, sent", Side::Out, &to_dan, "dan")
            .stands(SentState::Bounced);
        settle(&cast.alice, &relays.a.url, std::slice::from_ref(&bounced)).await;
        kinds.push(bounced);
        Some(Self {
            relays,
            kinds,
            cast,
        })
    }
}
