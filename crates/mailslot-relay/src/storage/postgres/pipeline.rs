//! Transactions that spend no round trip of their own on `BEGIN` or `COMMIT`, and none that
//! holds their locks while the relay decides.
//!
//! tokio-postgres sends a statement when its future is first polled, and `join!` polls in
//! order, so statements joined together go out in one write and the server runs them one
//! after the other, in that order. After a failure the later statements of the transaction
//! fail too, and a `COMMIT` behind them rolls it back (it answers `ROLLBACK`, no error): so
//! the statements' results are taken in order, the first error is the cause, and `COMMIT`'s
//! own error is one of the commit itself. [`Open::begin`] puts `BEGIN` in front of the
//! transaction's first statements that way; [`Open::finish`] puts `COMMIT` behind its last
//! ones, and statements that must run after it, outside the transaction, behind that;
//! [`Open::whole`] sends a transaction whose statements need no answer in between in one go.
//!
//! The wait saved matters beyond its own time: a transaction holds its row locks until its
//! `COMMIT` arrives, and on two busy cores the relay's task that would send it may wait for a
//! core for tens of milliseconds, while every transaction that needs those rows waits too.
//!
//! A connection must never go back to the pool inside a transaction: the next user's `BEGIN`
//! would only warn, and its statements would join this one. So an `Open` dropped before its
//! transaction is over (an error, or its task cancelled) takes its connection out of the pool;
//! closing it makes the server roll back.

use std::future::Future;

use deadpool_postgres::{Client, Object};

/// A pooled connection that a transaction may be open on.
pub(super) struct Open {
    client: Option<Object>,
    /// `COMMIT` or `ROLLBACK` went out: the connection may go back to the pool.
    over: bool,
}

impl Open {
    /// Watches `client` for the transaction [`Open::begin`] starts on it.
    pub(super) fn new(client: Object) -> Self {
        Self {
            client: Some(client),
            over: false,
        }
    }

    /// The connection back, once its transaction is over; `None` otherwise (it then leaves the
    /// pool, as when dropped).
    pub(super) fn into_idle(mut self) -> Option<Object> {
        if self.over { self.client.take() } else { None }
    }

    /// The connection.
    pub(super) fn client(&self) -> &Client {
        self.client
            .as_ref()
            .expect("the connection stays until the Open is dropped")
    }

    /// Runs `BEGIN` and then `first` (statements on this connection, joined in the order they
    /// must run) with one wait. `BEGIN`'s error comes first, then `first`'s results.
    pub(super) async fn begin<'a, F, T>(
        &'a self,
        first: impl FnOnce(&'a Client) -> F,
    ) -> Result<T, tokio_postgres::Error>
    where
        F: Future<Output = T> + 'a,
    {
        let client = self.client();
        let (begun, results) = futures_util::join!(client.batch_execute("BEGIN"), first(client));
        begun?;
        Ok(results)
    }

    /// Runs `last` (the transaction's last statements, joined in the order they must run),
    /// `COMMIT`, and then `after` (statements outside the transaction) with one wait.
    /// `COMMIT`'s error comes first, then `last`'s results (check them: after a failed
    /// statement the `COMMIT` rolled back), then `after`'s.
    pub(super) async fn finish<'a, F, G, T, U>(
        &'a mut self,
        last: impl FnOnce(&'a Client) -> F,
        after: impl FnOnce(&'a Client) -> G,
    ) -> Result<(T, U), tokio_postgres::Error>
    where
        F: Future<Output = T> + 'a,
        G: Future<Output = U> + 'a,
    {
        // Committed or rolled back by the server, the transaction is over once `COMMIT` is
        // sent, which the join below does in this same poll.
        self.over = true;
        let client = self.client();
        let (results, committed, after) =
            futures_util::join!(last(client), client.batch_execute("COMMIT"), after(client));
        committed?;
        Ok((results, after))
    }

    /// Runs `BEGIN`, `statements` (joined in the order they must run) and `COMMIT` with one
    /// wait. `BEGIN`'s and `COMMIT`'s errors come first, then `statements`' results (check
    /// them: after a failed statement the `COMMIT` rolled back).
    pub(super) async fn whole<'a, F, T>(
        &'a mut self,
        statements: impl FnOnce(&'a Client) -> F,
    ) -> Result<T, tokio_postgres::Error>
    where
        F: Future<Output = T> + 'a,
    {
        // As in `finish`: over once `COMMIT` is sent, in this same poll.
        self.over = true;
        let client = self.client();
        let (begun, results, committed) = futures_util::join!(
            client.batch_execute("BEGIN"),
            statements(client),
            client.batch_execute("COMMIT")
        );
        begun?;
        committed?;
        Ok(results)
    }

    /// Runs `ROLLBACK`, after a failure, unless the transaction is over already: the
    /// connection goes back to the pool only if the server confirms it is.
    pub(super) async fn rollback(&mut self) -> Result<(), tokio_postgres::Error> {
        if !self.over {
            self.client().batch_execute("ROLLBACK").await?;
            self.over = true;
        }
        Ok(())
    }
}

/// Runs `statements` (joined in the order they must run) in a transaction of their own that
/// commits without waiting for its flush, with one wait: for statements that only notify.
///
/// A notification gives its transaction an id, so its commit writes a commit record, and
/// PostgreSQL holds the one server-wide lock of notifying commits from `COMMIT` until that
/// record is flushed (so that notifications queue in commit order). Durable, as the pool's
/// connections commit, every wake of every node waited in line for one flush after another;
/// unflushed, the lock is held for the commit alone. A notification lost with a crash of the
/// database is lost with its listeners' connections anyway.
///
/// `BEGIN`, the statements and `COMMIT` go out in the first poll (see the module's notes), so
/// the server ends the transaction even if the caller stops waiting: the connection may go
/// back to the pool.
pub(super) async fn unflushed<'a, F, T>(
    client: &'a Client,
    statements: impl FnOnce(&'a Client) -> F,
) -> Result<T, tokio_postgres::Error>
where
    F: Future<Output = T> + 'a,
{
    let (begun, results, committed) = futures_util::join!(
        client.batch_execute("BEGIN; SET LOCAL synchronous_commit = off"),
        statements(client),
        client.batch_execute("COMMIT")
    );
    begun?;
    committed?;
    Ok(results)
}

impl Drop for Open {
    fn drop(&mut self) {
        if !self.over
            && let Some(client) = self.client.take()
        {
            // Out of the pool and closed: the server rolls the transaction back.
            drop(Object::take(client));
        }
    }
}
