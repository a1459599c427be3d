//! A frozen DynamoDB (`POST /strict/freeze`, `POST /strict/thaw`): what a stopped server process
//! does to its clients. While frozen, no call to the DynamoDB upstream (DynamoDB and DynamoDB
//! Streams) goes on and no answer from it comes back; at the thaw, every call held goes on, and
//! a call that arrived during the freeze is served then even if its client has given up (as a
//! stopped process, resumed, serves what waits in its sockets).

use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;

pub struct Freeze {
    frozen: watch::Sender<bool>,
    /// Calls and answers held by a freeze, in all.
    held: AtomicU64,
}

impl Default for Freeze {
    fn default() -> Self {
        Freeze {
            frozen: watch::channel(false).0,
            held: AtomicU64::new(0),
        }
    }
}

impl Freeze {
    /// Freezes or thaws; whether it was frozen before.
    pub fn set(&self, frozen: bool) -> bool {
        self.frozen.send_replace(frozen)
    }

    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Returns at once when not frozen, else at the thaw.
    pub async fn thawed(&self) {
        let mut rx = self.frozen.subscribe();
        if *rx.borrow_and_update() {
            self.held.fetch_add(1, Ordering::Relaxed);
            // The sender lives as long as `self`: an error cannot happen while it is borrowed.
            let _ = rx.wait_for(|frozen| !frozen).await;
        }
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        self.set(false);
        self.held.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_freeze_holds_until_the_thaw() {
        let f = Arc::new(Freeze::default());
        f.thawed().await;
        assert_eq!(f.held(), 0, "not frozen: nothing held");
        assert!(!f.set(true));
        let waiter = tokio::spawn({
            let f = f.clone();
            async move { f.thawed().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "held while frozen");
        assert!(f.set(false));
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("released at the thaw")
            .unwrap();
        assert_eq!(f.held(), 1);
        f.reset();
        assert_eq!((f.is_frozen(), f.held()), (false, 0));
    }
}
