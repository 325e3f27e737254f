//! Slots to run tasks in, one scheduler for the whole bridge: each agent has its own number
//! of slots (`max_concurrent_tasks`), and optionally the bridge has one for all agents
//! together. Waiting tasks are served by priority (urgent, then high, then normal), first
//! come first served within one, and a task is only granted a slot when both its agent and
//! the bridge have room, so a task never holds one slot while it waits for the other (which
//! would let a normal task stand before an urgent one). Waiting can be given up (the future
//! dropped, when the task is cancelled) without losing a slot.
//!
//! "First come" is the task's arrival as the caller numbers it (its journal row), not the
//! moment its future first asks: tasks are spawned on a multi-threaded runtime, which polls
//! them in no particular order, so asking order is not arrival order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::protocol::Priority;

pub struct Slots {
    state: Mutex<State>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().expect("slots lock");
        f.debug_struct("Slots")
            .field("bridge_free", &state.bridge_free)
            .field("waiting", &state.waiting.len())
            .finish()
    }
}

struct State {
    bridge_free: usize,
    agent_free: HashMap<String, usize>,
    /// In the order they are served: by rank (highest first), then by arrival.
    waiting: Vec<Waiter>,
    /// Slots granted and not yet given back.
    held: usize,
}

struct Waiter {
    rank: u8,
    seq: u64,
    agent: String,
    grant: oneshot::Sender<()>,
}

fn rank(priority: Priority) -> u8 {
    match priority {
        Priority::Urgent => 2,
        Priority::High => 1,
        Priority::Normal => 0,
    }
}

/// A slot held; given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    agent: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release(&self.agent);
    }
}

/// A place in the queue; dropping it gives the place up (and the slot back, if granted).
pub struct Ticket(Pending);

impl Ticket {
    /// Waits until the slot is granted.
    pub async fn granted(mut self) -> Slot {
        let pending = &mut self.0;
        let granted = pending.grant.as_mut().expect("set at enqueue").await;
        pending.grant = None;
        debug_assert!(granted.is_ok(), "a waiter is only dropped once granted");
        Slot {
            slots: pending.slots.clone(),
            agent: pending.agent.clone(),
        }
    }
}

/// A wait for a slot; if it is given up after the slot was granted, the slot goes back.
struct Pending {
    slots: Arc<Slots>,
    agent: String,
    grant: Option<oneshot::Receiver<()>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut grant) = self.grant.take() {
            if grant.try_recv().is_ok() {
                self.slots.release(&self.agent);
            }
        }
    }
}

impl Slots {
    /// A scheduler; `bridge` is the limit for all agents together (none when `None`).
    pub fn new(bridge: Option<usize>) -> Arc<Slots> {
        Arc::new(Slots {
            state: Mutex::new(State {
                bridge_free: bridge.map_or(usize::MAX, |n| n.max(1)),
                agent_free: HashMap::new(),
                waiting: Vec::new(),
                held: 0,
            }),
        })
    }

    /// Gives `agent` its own `count` slots.
    pub fn add_agent(&self, agent: &str, count: usize) {
        let mut state = self.state.lock().expect("slots lock");
        state.agent_free.insert(agent.to_string(), count.max(1));
    }

    /// Whether any task holds a slot or waits for one.
    pub fn busy(&self) -> bool {
        let state = self.state.lock().expect("slots lock");
        state.held > 0 || !state.waiting.is_empty()
    }

    /// Per agent: (slots free, tasks waiting for one), for the status a person reads.
    pub fn snapshot(&self) -> Vec<(String, usize, usize)> {
        let state = self.state.lock().expect("slots lock");
        let mut out: Vec<(String, usize, usize)> = state
            .agent_free
            .iter()
            .map(|(agent, free)| {
                let waiting = state.waiting.iter().filter(|w| &w.agent == agent).count();
                (agent.clone(), *free, waiting)
            })
            .collect();
        out.sort();
        out
    }

    /// Waits for a slot of `agent`, served by `priority`, then by `arrival` (lowest first).
    pub async fn acquire(self: &Arc<Self>, agent: &str, priority: Priority, arrival: u64) -> Slot {
        self.enqueue(agent, priority, arrival).granted().await
    }

    /// Takes a place in the queue now (without waiting): a task enqueued at delivery holds
    /// its place by arrival even before its future is first polled.
    pub fn enqueue(self: &Arc<Self>, agent: &str, priority: Priority, arrival: u64) -> Ticket {
        let receiver = {
            let mut state = self.state.lock().expect("slots lock");
            state.agent_free.entry(agent.to_string()).or_insert(1);
            let (grant, receiver) = oneshot::channel();
            let waiter = Waiter {
                rank: rank(priority),
                seq: arrival,
                agent: agent.to_string(),
                grant,
            };
            let at = state.waiting.partition_point(|w| {
                (w.rank, std::cmp::Reverse(w.seq)) > (waiter.rank, std::cmp::Reverse(arrival))
            });
            state.waiting.insert(at, waiter);
            serve(&mut state);
            receiver
        };
        Ticket(Pending {
            slots: self.clone(),
            agent: agent.to_string(),
            grant: Some(receiver),
        })
    }

    fn release(&self, agent: &str) {
        let mut state = self.state.lock().expect("slots lock");
        state.bridge_free = state.bridge_free.saturating_add(1);
        state.held = state.held.saturating_sub(1);
        *state.agent_free.entry(agent.to_string()).or_insert(0) += 1;
        serve(&mut state);
    }
}

/// Grants slots, best waiter first, to every waiter whose agent and the bridge have room.
fn serve(state: &mut State) {
    let mut i = 0;
    while i < state.waiting.len() && state.bridge_free > 0 {
        let agent_free = state
            .agent_free
            .get(&state.waiting[i].agent)
            .copied()
            .unwrap_or(0);
        if state.waiting[i].grant.is_closed() {
            state.waiting.remove(i);
            continue;
        }
        if agent_free == 0 {
            i += 1;
            continue;
        }
        let waiter = state.waiting.remove(i);
        if waiter.grant.send(()).is_ok() {
            state.bridge_free -= 1;
            state.held += 1;
            *state
                .agent_free
                .get_mut(&waiter.agent)
                .expect("known agent") -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn queued(slots: &Slots, n: usize) {
        while slots.state.lock().unwrap().waiting.len() < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn slots_go_by_priority_then_by_arrival_across_agents() {
        // Agent a has 2 slots, the bridge 1: a second task of `a` must not jump ahead.
        let slots = Slots::new(Some(1));
        slots.add_agent("a", 2);
        slots.add_agent("b", 1);
        assert!(!slots.busy());
        let held = slots.acquire("a", Priority::Normal, 0).await;
        assert!(slots.busy());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (name, agent, p) in [
            ("a-normal", "a", Priority::Normal),
            ("b-high", "b", Priority::High),
            ("a-normal-2", "a", Priority::Normal),
            ("b-urgent", "b", Priority::Urgent),
            ("a-high", "a", Priority::High),
        ] {
            let (pool, order) = (slots.clone(), order.clone());
            let arrival = waiting.len() as u64 + 1;
            waiting.push(tokio::spawn(async move {
                let _slot = pool.acquire(agent, p, arrival).await;
                order.lock().unwrap().push(name);
            }));
            queued(&slots, waiting.len()).await;
        }
        drop(held);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            vec!["b-urgent", "b-high", "a-high", "a-normal", "a-normal-2"]
        );
        assert!(!slots.busy(), "every slot given back");
    }

    #[tokio::test]
    async fn equal_priorities_go_by_arrival_whatever_order_they_ask_in() {
        // Issue 18: a burst ran as 34, 32, 31, 33, 35: the spawned tasks asked out of order.
        let slots = Slots::new(None);
        slots.add_agent("a", 1);
        let held = slots.acquire("a", Priority::Normal, 30).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for arrival in [34u64, 32, 31, 33, 35] {
            let (pool, order) = (slots.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _slot = pool.acquire("a", Priority::Normal, arrival).await;
                order.lock().unwrap().push(arrival);
            }));
            queued(&slots, waiting.len()).await;
        }
        drop(held);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![31, 32, 33, 34, 35]);
    }

    #[tokio::test]
    async fn an_agents_own_limit_holds_without_a_bridge_limit() {
        let slots = Slots::new(None);
        slots.add_agent("a", 1);
        let held = slots.acquire("a", Priority::Normal, 0).await;
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            slots.acquire("b", Priority::Normal, 0),
        )
        .await;
        assert!(other.is_ok(), "another agent is not held up");
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            slots.acquire("a", Priority::Urgent, 0),
        )
        .await;
        assert!(blocked.is_err(), "a's one slot is taken");
        drop(held);
        assert!(tokio::time::timeout(
            std::time::Duration::from_secs(5),
            slots.acquire("a", Priority::Normal, 0)
        )
        .await
        .is_ok());
    }

    #[tokio::test]
    async fn a_wait_given_up_does_not_lose_the_slot() {
        let slots = Slots::new(Some(1));
        let held = slots.acquire("a", Priority::Normal, 0).await;
        let gave_up = {
            let slots = slots.clone();
            tokio::spawn(async move {
                let _ = slots.acquire("a", Priority::Urgent, 0).await;
            })
        };
        queued(&slots, 1).await;
        gave_up.abort();
        let _ = gave_up.await;
        drop(held);
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            slots.acquire("a", Priority::Normal, 0),
        )
        .await;
        assert!(again.is_ok(), "the slot came back");
    }
}
