//! Transactions that spend no round trip of their own on `BEGIN` or on what follows `COMMIT`.
//!
//! tokio-postgres sends a statement when its future is first polled, and `join!` polls in
//! order, so statements joined together go out in one write and the server runs them one
//! after the other, in that order (after a failure the later ones of a transaction fail too,
//! so errors are taken in order and the first is the cause). [`Open::begin`] puts `BEGIN` in
//! front of the transaction's first statements that way, and [`Open::commit_then`] puts
//! statements that must run after the commit, outside the transaction, behind `COMMIT`.
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

    /// Runs `COMMIT` and then `after` (statements outside the transaction) with one wait.
    /// `COMMIT`'s error comes first, then `after`'s results.
    pub(super) async fn commit_then<'a, F, T>(
        &'a mut self,
        after: impl FnOnce(&'a Client) -> F,
    ) -> Result<T, tokio_postgres::Error>
    where
        F: Future<Output = T> + 'a,
    {
        // Committed or rolled back by the server, the transaction is over once `COMMIT` is
        // sent, which the join below does in this same poll.
        self.over = true;
        let client = self.client();
        let (committed, results) =
            futures_util::join!(client.batch_execute("COMMIT"), after(client));
        committed?;
        Ok(results)
    }

    /// Runs `ROLLBACK`, after a failure: the connection goes back to the pool only if the
    /// server confirms the transaction is over.
    pub(super) async fn rollback(&mut self) -> Result<(), tokio_postgres::Error> {
        self.client().batch_execute("ROLLBACK").await?;
        self.over = true;
        Ok(())
    }

    /// Runs `COMMIT`.
    pub(super) async fn commit(&mut self) -> Result<(), tokio_postgres::Error> {
        self.commit_then(|_| std::future::ready(())).await
    }
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
