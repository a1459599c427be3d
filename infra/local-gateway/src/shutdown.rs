//! Stopping: one signal for every task, and a way to wait until they have all ended.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

/// Held by every task of the gateway: tells it to stop, and (while it lives) that it has not.
#[derive(Clone)]
pub(crate) struct Shutdown {
    signal: watch::Receiver<bool>,
    _alive: mpsc::Sender<()>,
}

/// Held by the gateway's owner.
pub(crate) struct Trigger {
    signal: watch::Sender<bool>,
    alive: mpsc::Receiver<()>,
}

impl Shutdown {
    pub(crate) fn new() -> (Trigger, Shutdown) {
        let (signal_tx, signal) = watch::channel(false);
        let (alive_tx, alive) = mpsc::channel(1);
        (
            Trigger {
                signal: signal_tx,
                alive,
            },
            Shutdown {
                signal,
                _alive: alive_tx,
            },
        )
    }

    pub(crate) fn is_set(&self) -> bool {
        *self.signal.borrow()
    }

    /// Resolves once shutdown has been triggered.
    pub(crate) async fn wait(&self) {
        let mut signal = self.signal.clone();
        let _ = signal.wait_for(|stop| *stop).await;
    }

    /// Sleeps; false when shutdown came first.
    pub(crate) async fn sleep(&self, duration: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(duration) => true,
            _ = self.wait() => false,
        }
    }
}

impl Trigger {
    /// Signals every task and waits until all of them have dropped their `Shutdown`.
    pub(crate) async fn fire(mut self, at_most: Duration) {
        let _ = self.signal.send(true);
        if tokio::time::timeout(at_most, self.alive.recv())
            .await
            .is_err()
        {
            tracing::warn!("local-gateway: some tasks did not stop in time");
        }
    }
}
