//! Keeping the journal's size bounded while the bridge runs: finished tasks are forgotten
//! after the retention, the oldest finished ones go first when the journal passes its size
//! limit (never a task still to be answered, never a mail still to be sent), and the pages
//! freed are given back to the file system (incremental auto_vacuum; SQLite otherwise keeps
//! a file at its largest size for ever).

use std::path::Path;
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection};

use super::{millis, Journal, JournalError};

/// States of a task that has nothing left to do here.
const DONE_STATES: &str = "('answered', 'rejected', 'cancelled', 'expired', 'elsewhere')";

/// At most this many tasks are forgotten per step when the journal is over its size (then
/// it is measured again).
const SIZE_BATCH: i64 = 5_000;

/// How the journal is kept: how long finished tasks are remembered, and how large it may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Upkeep {
    pub retention: Duration,
    /// The journal's pages in use are brought under this many bytes (to 90 % of it, so the
    /// next round does not start at once).
    pub max_bytes: u64,
}

/// What one round of upkeep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// Finished tasks forgotten for their age.
    pub expired: usize,
    /// Finished tasks forgotten, oldest first, for the journal's size.
    pub for_size: usize,
    /// The journal's size on disk afterwards (the database and its write-ahead log).
    pub bytes: u64,
}

impl Journal {
    /// Forgets finished tasks (and their sent mails) last touched before `before`. Returns
    /// how many tasks were removed.
    pub fn prune(&self, before: SystemTime) -> Result<usize, JournalError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                &format!("DELETE FROM tasks WHERE updated_at < ?1 AND state IN {DONE_STATES}
                 AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task = tasks.id AND o.sent_at IS NULL AND o.failed_at IS NULL)"),
                params![millis(before)],
            )?;
            tx.execute(
                "DELETE FROM outbox WHERE task IS NULL AND created_at < ?1 AND (sent_at IS NOT NULL OR failed_at IS NOT NULL)",
                params![millis(before)],
            )?;
            tx.execute(
                "DELETE FROM cancels WHERE created_at < ?1",
                params![millis(before)],
            )?;
            tx.execute("DELETE FROM pair_codes WHERE expires_at < ?1", params![millis(before)])?;
            tx.execute("DELETE FROM pair_failures WHERE at < ?1", params![millis(before)])?;
            // The hourly sums outlive the tasks (a month's budget, a year's report).
            let hours = super::hour_of(before) - (super::USAGE_HOURS_KEPT.as_secs() / 3600) as i64;
            tx.execute("DELETE FROM usage_hours WHERE hour < ?1", params![hours])?;
            tx.commit()?;
            Ok(n)
        })
    }

    /// One round of upkeep at `now`: prune by age, then by size, then give the freed space
    /// back. Blocking (SQLite): run it off the async runtime.
    pub fn upkeep(&self, upkeep: &Upkeep, now: SystemTime) -> Result<Kept, JournalError> {
        let expired = self.prune(now - upkeep.retention)?;
        let for_size = self.with(|c| bound_size(c, upkeep.max_bytes))?;
        self.with(|c| {
            // Gives every free page back: the file shrinks at the checkpoint that follows
            // (WAL), which also empties the write-ahead log.
            let mut vacuum = c.prepare("PRAGMA incremental_vacuum")?;
            let mut steps = vacuum.query([])?;
            while steps.next()?.is_some() {}
            drop(steps);
            drop(vacuum);
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        })?;
        Ok(Kept {
            expired,
            for_size,
            bytes: size_on_disk(&self.path),
        })
    }
}

/// Bytes of the journal's pages in use (not counting free pages).
fn used_bytes(c: &Connection) -> rusqlite::Result<u64> {
    let pragma = |name: &str| c.pragma_query_value(None, name, |r| r.get::<_, i64>(0));
    let used = pragma("page_count")? - pragma("freelist_count")?;
    Ok(used.max(0) as u64 * pragma("page_size")?.max(0) as u64)
}

/// Forgets the oldest finished tasks until the pages in use fit in 90 % of `max_bytes`
/// (when they are over `max_bytes`), or nothing finished is left. Returns how many went.
fn bound_size(c: &mut Connection, max_bytes: u64) -> rusqlite::Result<usize> {
    if used_bytes(c)? <= max_bytes {
        return Ok(0);
    }
    let target = max_bytes / 10 * 9;
    let mut removed = 0;
    loop {
        let used = used_bytes(c)?;
        if used <= target {
            break;
        }
        // As many tasks as the excess is of the whole, taking them as alike in size, so the
        // journal ends near its target rather than far under it; measured again after.
        let tasks: i64 = c.query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))?;
        let tasks = tasks.max(0) as u64;
        let batch = (u128::from(tasks) * u128::from(used - target) / u128::from(used))
            .clamp(1, SIZE_BATCH as u128) as i64;
        let tx = c.transaction()?;
        let n = tx.execute(
            &format!("DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE state IN {DONE_STATES}
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task = tasks.id AND o.sent_at IS NULL AND o.failed_at IS NULL)
               ORDER BY id LIMIT ?1)"),
            params![batch],
        )?;
        let mails = tx.execute(
            "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE task IS NULL
               AND (sent_at IS NOT NULL OR failed_at IS NOT NULL) ORDER BY id LIMIT ?1)",
            params![SIZE_BATCH],
        )?;
        tx.commit()?;
        removed += n;
        if n == 0 && mails == 0 {
            break;
        }
    }
    Ok(removed)
}

/// The journal's size on disk: the database file and its write-ahead log.
pub fn size_on_disk(path: &Path) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    len(path) + len(Path::new(&wal))
}

/// Switches a journal to incremental auto_vacuum, so freed pages can be given back: a new
/// one at once; one written by an older build (mode none) by a VACUUM, once, which rewrites
/// the file (it takes as long as copying it).
pub(super) fn incremental_vacuum(conn: &Connection) -> rusqlite::Result<()> {
    let mode: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
    if mode == 2 {
        return Ok(());
    }
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    let tables: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))?;
    if tables > 0 {
        tracing::info!(
            "switching the task journal to incremental vacuum (once; rewrites the file)"
        );
        conn.execute_batch("VACUUM")?;
    }
    Ok(())
}

/// Runs [`Journal::upkeep`] every `every` until `stop`, off the async runtime: the journal's
/// size stays bounded while the bridge runs, not only at its start.
pub async fn keep(
    journal: std::sync::Arc<Journal>,
    upkeep: Upkeep,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => return,
        }
        let journal = journal.clone();
        let round = tokio::task::spawn_blocking(move || journal.upkeep(&upkeep, SystemTime::now()));
        match round.await {
            Ok(Ok(kept)) => log_kept(&kept),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not prune the task journal"),
            Err(e) => tracing::warn!(error = %e, "the task journal's upkeep stopped"),
        }
    }
}

/// Says what a round of upkeep forgot, when it forgot anything.
pub fn log_kept(kept: &Kept) {
    if kept.expired + kept.for_size > 0 {
        tracing::info!(
            expired = kept.expired,
            for_size = kept.for_size,
            bytes = kept.bytes,
            "forgot finished tasks (older than the journal's retention, or oldest first over its size limit)"
        );
    }
}
