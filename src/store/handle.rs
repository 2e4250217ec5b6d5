//! Async access to a [`Store`]: its work runs on one dedicated thread, so SQLite never blocks
//! the async runtime, and writes from one process are naturally serialized.

use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use super::{Store, StoreError};

type Job = Box<dyn FnOnce(&mut Store) + Send>;

/// A cloneable handle; the thread stops when the last handle is dropped.
#[derive(Clone)]
pub struct StoreHandle {
    jobs: mpsc::Sender<Job>,
}

impl StoreHandle {
    /// Moves `store` onto a new thread named `mailslot-store`.
    pub fn spawn(mut store: Store) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("mailslot-store".into())
            .spawn(move || {
                for job in queue {
                    job(&mut store);
                }
            })?;
        Ok(Self { jobs })
    }

    /// Runs `f` on the store thread and awaits its result.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Store) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, result) = oneshot::channel();
        let job: Job = Box::new(move |store| {
            let _ = reply.send(f(store));
        });
        self.jobs.send(job).map_err(|_| StoreError::Closed)?;
        result.await.map_err(|_| StoreError::Closed)?
    }
}
