//! The open WebSocket connections of this gateway, by connection id: what the Management API
//! pushes to, inspects and closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use time::OffsetDateTime;
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::Message;

/// Frames queued per connection. A client that lets this many pile up is not reading: its
/// connection is dropped (the push answered 410, as for any closed connection), so that it
/// reconnects and catches up, rather than refused with 429, which the fanout takes for the
/// service's own throttling and retries the whole record for everyone (found by fault probing:
/// one such client held back its conversations' pushes to every member by 10–18 s).
const QUEUE: usize = 1024;

/// What a connection's session task is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    Send(Message),
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Info {
    pub connected_at: OffsetDateTime,
    pub last_active_at: OffsetDateTime,
    pub source_ip: String,
    pub user_agent: Option<String>,
}

struct Connection {
    commands: mpsc::Sender<Command>,
    /// Wakes its session to drop the socket at once, even in the middle of a write the client
    /// does not read.
    kill: Arc<Notify>,
    info: Info,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SendError {
    Gone,
    Full,
}

#[derive(Clone, Default)]
pub(crate) struct Registry {
    connections: Arc<Mutex<HashMap<String, Connection>>>,
    /// Test hook: connection id → (status, how many POSTs still answer it).
    faults: Arc<Mutex<HashMap<String, (u16, u32)>>>,
}

impl Registry {
    /// Adds a connection (before `$connect` runs, so a push racing the handshake is queued rather
    /// than answered 410); returns where its commands arrive, and what says to drop it at once.
    pub(crate) fn add(&self, id: &str, info: Info) -> (mpsc::Receiver<Command>, Arc<Notify>) {
        let (commands, rx) = mpsc::channel(QUEUE);
        let kill = Arc::new(Notify::new());
        let connection = Connection {
            commands,
            kill: kill.clone(),
            info,
        };
        self.lock().insert(id.to_owned(), connection);
        (rx, kill)
    }

    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    pub(crate) fn info(&self, id: &str) -> Option<Info> {
        self.lock().get(id).map(|c| c.info.clone())
    }

    pub(crate) fn touch(&self, id: &str) {
        if let Some(c) = self.lock().get_mut(id) {
            c.info.last_active_at = OffsetDateTime::now_utc();
        }
    }

    /// Queues a frame for the client. A full queue drops the connection (`Full`: it is gone
    /// now, and its session drops the socket).
    pub(crate) fn send(&self, id: &str, frame: Message) -> Result<(), SendError> {
        let mut connections = self.lock();
        let c = connections.get_mut(id).ok_or(SendError::Gone)?;
        match c.commands.try_send(Command::Send(frame)) {
            Ok(()) => {
                c.info.last_active_at = OffsetDateTime::now_utc();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                if let Some(c) = connections.remove(id) {
                    c.kill.notify_one();
                }
                Err(SendError::Full)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SendError::Gone),
        }
    }

    /// Forgets the connection (later pushes get 410) and asks its session to close the socket;
    /// false when there is no such connection.
    pub(crate) fn close(&self, id: &str) -> bool {
        match self.lock().remove(id) {
            // Even with a full queue it closes: then the session drops the socket at once.
            Some(c) => {
                if c.commands.try_send(Command::Close).is_err() {
                    c.kill.notify_one();
                }
                true
            }
            None => false,
        }
    }

    pub(crate) fn inject_failures(&self, id: &str, status: u16, times: u32) {
        let mut faults = self.faults.lock().unwrap();
        if times == 0 {
            faults.remove(id);
        } else {
            faults.insert(id.to_owned(), (status, times));
        }
    }

    pub(crate) fn pending_failures(&self, id: &str) -> u32 {
        self.faults.lock().unwrap().get(id).map_or(0, |f| f.1)
    }

    /// The injected status the next POST to `id` must answer, if any (and uses it up).
    pub(crate) fn take_failure(&self, id: &str) -> Option<u16> {
        let mut faults = self.faults.lock().unwrap();
        let (status, left) = faults.get_mut(id)?;
        let status = *status;
        *left -= 1;
        if *left == 0 {
            faults.remove(id);
        }
        Some(status)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Connection>> {
        self.connections.lock().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> Info {
        let now = OffsetDateTime::now_utc();
        Info {
            connected_at: now,
            last_active_at: now,
            source_ip: "127.0.0.1".into(),
            user_agent: None,
        }
    }

    /// A client that lets its queue fill is dropped: the push that found it full, and every
    /// later one, is told it is gone, and its session is told to drop the socket.
    #[tokio::test]
    async fn a_client_not_reading_is_dropped_when_its_queue_fills() {
        let registry = Registry::default();
        let (_commands, kill) = registry.add("c1", info());
        for _ in 0..QUEUE {
            assert_eq!(registry.send("c1", Message::text("x")), Ok(()));
        }
        assert_eq!(
            registry.send("c1", Message::text("x")),
            Err(SendError::Full)
        );
        assert_eq!(registry.info("c1"), None);
        assert_eq!(
            registry.send("c1", Message::text("x")),
            Err(SendError::Gone)
        );
        tokio::time::timeout(std::time::Duration::from_secs(1), kill.notified())
            .await
            .expect("the session is told to drop the socket");
    }
}
