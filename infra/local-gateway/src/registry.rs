//! The open WebSocket connections of this gateway, by connection id: what the Management API
//! pushes to, inspects and closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// Frames queued per connection before a push is refused with 429 (a client not reading).
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
    /// than answered 410); returns where its commands arrive.
    pub(crate) fn add(&self, id: &str, info: Info) -> mpsc::Receiver<Command> {
        let (commands, rx) = mpsc::channel(QUEUE);
        self.lock()
            .insert(id.to_owned(), Connection { commands, info });
        rx
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

    /// Queues a frame for the client.
    pub(crate) fn send(&self, id: &str, frame: Message) -> Result<(), SendError> {
        let mut connections = self.lock();
        let c = connections.get_mut(id).ok_or(SendError::Gone)?;
        match c.commands.try_send(Command::Send(frame)) {
            Ok(()) => {
                c.info.last_active_at = OffsetDateTime::now_utc();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(SendError::Full),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SendError::Gone),
        }
    }

    /// Forgets the connection (later pushes get 410) and asks its session to close the socket;
    /// false when there is no such connection.
    pub(crate) fn close(&self, id: &str) -> bool {
        match self.lock().remove(id) {
            // Even with a full queue it closes: the session also stops when the sender is dropped.
            Some(c) => {
                let _ = c.commands.try_send(Command::Close);
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
