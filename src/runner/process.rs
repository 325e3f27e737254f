//! Child processes in their own process group, stopped as a group: SIGTERM, a grace period,
//! then SIGKILL. Every agent process goes through here.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A spawned child that leads its own process group.
pub struct GroupChild {
    pub child: Child,
    pgid: Pid,
}

impl GroupChild {
    /// Spawns `cmd` as the leader of a new process group. The group is also killed if this
    /// value is dropped without being waited for (`kill_on_drop` covers the leader; `Drop`
    /// covers the rest of the group).
    pub fn spawn(cmd: &mut Command) -> io::Result<GroupChild> {
        cmd.process_group(0).kill_on_drop(true);
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the child between fork and exec and only makes one
        // system call (prctl), which is async-signal-safe.
        unsafe {
            // If the bridge dies (even by SIGKILL), the agent gets SIGKILL too. What the
            // agent started itself is found by its tag at the next start (`kill_tagged`).
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)
            });
        }
        let child = cmd.spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
        Ok(GroupChild {
            child,
            pgid: Pid::from_raw(pid as i32),
        })
    }

    /// The child's pipes: stdin when it was piped, stdout and stderr (an agent's always are).
    pub fn pipes(
        &mut self,
    ) -> (
        Option<tokio::process::ChildStdin>,
        tokio::process::ChildStdout,
        tokio::process::ChildStderr,
    ) {
        let stdout = self.child.stdout.take().expect("stdout is piped");
        let stderr = self.child.stderr.take().expect("stderr is piped");
        (self.child.stdin.take(), stdout, stderr)
    }

    pub fn pid(&self) -> i32 {
        self.pgid.as_raw()
    }

    /// Waits for the leader's exit and returns its stdout (which must be piped); the rest of
    /// the group is stopped afterwards.
    pub async fn wait_output(mut self) -> std::io::Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            // Bounded: a version line, not a stream.
            let mut limited = (&mut stdout).take(64 * 1024);
            limited.read_to_end(&mut out).await?;
        }
        self.child.wait().await?;
        Ok(out)
    }

    /// Sends `signal` to the whole group. `false` when the group no longer exists.
    pub fn signal(&self, signal: Signal) -> bool {
        !matches!(killpg(self.pgid, signal), Err(Errno::ESRCH))
    }

    fn group_alive(&self) -> bool {
        !matches!(killpg(self.pgid, None), Err(Errno::ESRCH))
    }

    /// Stops the group: SIGTERM, up to `grace` for the leader to exit, then SIGKILL. Returns
    /// the leader's exit status.
    pub async fn terminate(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                self.reap_group(grace).await;
                status
            }
            Err(_) => {
                self.signal(Signal::SIGKILL);
                self.child.wait().await
            }
        }
    }

    /// After the leader has exited: anything left in its group (a grandchild that kept our
    /// pipes open, a daemon it started) gets SIGTERM, then SIGKILL after `grace`.
    pub async fn reap_group(&self, grace: Duration) {
        if !self.group_alive() {
            return;
        }
        self.signal(Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        // There is no event for "a process that is not our child exited", so look again
        // every few milliseconds until the group is gone or the grace is over.
        while self.group_alive() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.signal(Signal::SIGKILL);
    }
}

/// Every process of this user whose environment holds `name=value`, leaving out this one.
/// Agents are started with tags in their environment, and what they start inherits it, even
/// a process that left the agent's process group (`setsid`). Linux only (it reads /proc);
/// elsewhere the list is empty.
pub fn tagged(name: &str, value: &str) -> Vec<i32> {
    tagged_since(name, value, None)
}

/// The process id the kernel handed out last (the fifth field of /proc/loadavg); `None`
/// where it cannot be read.
pub fn last_pid() -> Option<i32> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .nth(4)?
        .parse()
        .ok()
}

/// Like [`tagged`], among the processes created after `since` (a [`last_pid`] read before
/// the tag was first given out): no other process can carry it. Reading another process's
/// environment is the costly part of the check, so on a machine with hundreds of processes
/// this reads a handful instead of all of them. Process ids are handed out in increasing
/// order and wrap at the system's maximum; both cases are covered.
pub fn tagged_since(name: &str, value: &str, since: Option<i32>) -> Vec<i32> {
    let needle = format!("{name}={value}");
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .collect();
    // Read after listing: every listed process was created at or before `now`.
    let window = since.zip(last_pid());
    pids.into_iter()
        .filter(|pid| match window {
            Some((since, now)) if now >= since => *pid > since && *pid <= now,
            Some((since, now)) => *pid > since || *pid <= now,
            None => true,
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// Whether process `pid`'s environment holds `name=value` (Linux only: reads /proc).
pub fn has_tag(pid: i32, name: &str, value: &str) -> bool {
    let needle = format!("{name}={value}");
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
}

/// Kills (SIGKILL) every process tagged `name=value`, and the process groups they lead.
/// Returns how many processes were found.
pub fn kill_tagged(name: &str, value: &str) -> usize {
    kill_tagged_since(name, value, None)
}

/// Like [`kill_tagged`], among the processes created after `since` (see [`tagged_since`]).
pub fn kill_tagged_since(name: &str, value: &str, since: Option<i32>) -> usize {
    let pids = tagged_since(name, value, since);
    for pid in &pids {
        let pid = Pid::from_raw(*pid);
        if nix::unistd::getpgid(Some(pid)).ok() == Some(pid) {
            let _ = killpg(pid, Signal::SIGKILL);
        }
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    pids.len()
}

/// Kills the process group `pgid` if its leader still carries `name=value` in its
/// environment, so a recorded group id that the OS has since given to someone else is left
/// alone. Returns whether it was killed.
pub fn kill_group_if_tagged(pgid: i32, name: &str, value: &str) -> bool {
    if pgid <= 1 {
        return false;
    }
    let needle = format!("{name}={value}");
    let ours = std::fs::read(format!("/proc/{pgid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()));
    ours && killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok()
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        // Best effort: a group that is already gone answers ESRCH, which is fine.
        let _ = killpg(self.pgid, Signal::SIGKILL);
    }
}
