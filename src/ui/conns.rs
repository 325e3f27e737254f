//! The live view's open connections, bounded so that idle ones cannot lock the page out.
//!
//! A connection that has not yet shown the token and is not serving a request ("idle") is
//! the first to go: when a peer holds [`PER_PEER`] idle ones, or all [`MAX_OPEN`] are taken,
//! the oldest idle one is closed to make room for the newcomer. So a flood of connections
//! that send nothing (or send slowly) costs the operator's browser nothing but the time to
//! accept it; connections that showed the token (the page's feed and actions) are never
//! closed for a newcomer. Idle connections that stay also end at the header timeout.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Connections open at once at most.
pub const MAX_OPEN: usize = 64;
/// Idle connections from one address at most.
pub const PER_PEER: usize = 8;

/// No request under way, and no token shown yet: may be closed for a newcomer.
const IDLE: u8 = 0;
/// A request is being served.
const BUSY: u8 = 1;
/// The token was shown on this connection: it stays.
const TRUSTED: u8 = 2;

/// The table of open connections, oldest first.
#[derive(Default)]
pub struct Conns {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

struct Entry {
    peer: IpAddr,
    state: Arc<AtomicU8>,
    close: CancellationToken,
}

/// One admitted connection: its state, and the token that closes it when it is evicted.
/// Dropping it frees its place.
pub struct Slot {
    id: u64,
    conns: Arc<Conns>,
    state: Arc<AtomicU8>,
    pub close: CancellationToken,
}

impl Slot {
    /// A request begins.
    pub fn busy(&self) {
        let _ = self
            .state
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A request ended; `trusted` when it carried the token.
    pub fn done(&self, trusted: bool) {
        if trusted {
            self.state.store(TRUSTED, Ordering::Release);
        } else {
            let _ = self
                .state
                .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns.lock().open.remove(&self.id);
    }
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding it leaves the table as consistent as any step made it.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `peer`, closing the oldest idle one of that peer, or of
    /// anyone when all places are taken. `None` when every place holds a busy or trusted
    /// connection.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut table = self.lock();
        let idle = |e: &Entry| e.state.load(Ordering::Acquire) == IDLE;
        let of_peer: Vec<u64> = table
            .open
            .iter()
            .filter(|(_, e)| e.peer == peer && idle(e))
            .map(|(id, _)| *id)
            .collect();
        if of_peer.len() >= PER_PEER {
            table.evict(of_peer[0]);
        }
        if table.open.len() >= MAX_OPEN {
            let oldest = table.open.iter().find(|(_, e)| idle(e)).map(|(id, _)| *id);
            match oldest {
                Some(id) => table.evict(id),
                None => return None,
            }
        }
        let id = table.next;
        table.next += 1;
        let state = Arc::new(AtomicU8::new(IDLE));
        let close = CancellationToken::new();
        table.open.insert(
            id,
            Entry {
                peer,
                state: state.clone(),
                close: close.clone(),
            },
        );
        Some(Slot {
            id,
            conns: self.clone(),
            state,
            close,
        })
    }
}

impl Table {
    fn evict(&mut self, id: u64) {
        if let Some(entry) = self.open.remove(&id) {
            tracing::debug!(peer = %entry.peer, "closing an idle live view connection for a new one");
            entry.close.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_connections_make_room_and_trusted_ones_stay() {
        let conns = Arc::new(Conns::default());
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let trusted = conns.admit(local).unwrap();
        trusted.busy();
        trusted.done(true);
        let mut idle: Vec<Slot> = (0..PER_PEER).map(|_| conns.admit(local).unwrap()).collect();
        // The peer's ninth idle connection closes its oldest idle one, not the trusted one.
        let newcomer = conns.admit(local).unwrap();
        assert!(idle[0].close.is_cancelled());
        assert!(!trusted.close.is_cancelled());
        assert!(idle[1..].iter().all(|s| !s.close.is_cancelled()));
        // A busy connection is not idle.
        newcomer.busy();
        idle.drain(..).for_each(drop);
        let others: Vec<Slot> = (0..MAX_OPEN - 2)
            .map(|i| {
                let peer = IpAddr::from([10, 0, (i / 250) as u8, (i % 250) as u8]);
                let slot = conns.admit(peer).unwrap();
                slot.busy();
                slot
            })
            .collect();
        assert!(conns.admit(local).is_none(), "all places busy or trusted");
        others[0].done(false);
        assert!(conns.admit(local).is_some(), "an idle one makes room");
        assert!(others[0].close.is_cancelled());
    }
}
