//! The matrix across features (issue 28): every mailbox view over mail of every kind, on both
//! relay backends. Each feature has tests of its own; the bugs this finds live where they meet
//! (mail to another relay once broke every view of the sender's).
//!
//! Per backend, one world is built (`matrix/world.rs`: relays A and B, alice on A and the
//! agents she writes with, mail of every kind in alice's store) and then every view of alice's
//! mailbox is checked against it: the CLI and export/import with `doctor` (`matrix/cli.rs`), a
//! real `mailslot mcp`'s tools and resources (`matrix/mcp.rs`), the dashboard
//! (`matrix/dashboard.rs`). A failing cell does not stop the others: the test fails at the end
//! with every (view × kind) that was wrong.
//!
//! To add a kind: make its mail in `matrix/world.rs` and push a [`Kind`] saying what every view
//! must show of it (`matrix/kinds.rs`). To add a view: write a `check` that records one cell per
//! kind, and call it from [`run`].

mod cast;
mod cli;
mod dashboard;
mod kinds;
mod mcp;
mod world;

use std::time::Instant;

use kinds::Cells;
use world::World;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

macro_rules! matrix {
    ($($name:ident => $backend:expr),* $(,)?) => {$(
        // Multi-threaded: the test waits on child processes while the in-process relays serve.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run($backend).await;
        }
    )*};
}

matrix! {
    every_view_shows_every_kind_of_mail_on_sqlite => Backend::Sqlite,
    every_view_shows_every_kind_of_mail_on_postgres => Backend::Postgres,
}

/// Builds the world on `backend`, then checks every view of it.
async fn run(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let Some(world) = World::build(backend, keys.path()).await else {
        return;
    };
    let built = started.elapsed();
    let home = world.cast.alice.home().to_owned();
    let url = world.relays.a.url.clone();
    let kinds = &world.kinds;
    let mut cells = Cells::default();
    // Export and doctor first, and the views that mark mail read last.
    cli::check_archive(&home, &url, kinds, &mut cells).await;
    cli::check_doctor(&home, &url, &mut cells).await;
    dashboard::check(&home, &url, kinds, &mut cells).await;
    mcp::check(&home, &url, kinds, &mut cells).await;
    cli::check(&home, &url, kinds, &mut cells).await;
    eprintln!(
        "matrix on {backend:?}: {} kinds, {} cells passed, {} failed; world built in {:.1} s, views checked in {:.1} s",
        kinds.len(),
        cells.passed,
        cells.failed.len(),
        built.as_secs_f64(),
        (started.elapsed() - built).as_secs_f64()
    );
    world.relays.shutdown().await;
    assert!(
        cells.failed.is_empty(),
        "{} of {} cells failed on {backend:?}:\n{}",
        cells.failed.len(),
        cells.failed.len() + cells.passed,
        cells.failed.join("\n")
    );
}
