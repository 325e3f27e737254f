//! The ACP terminal methods a client offers (`terminal/create`, `terminal/output`,
//! `terminal/wait_for_exit`, `terminal/kill`, `terminal/release`): commands the agent runs
//! through the bridge, confined to the task's workspace (their folder must be inside it),
//! without a shell, each in a process group of its own, their output (stdout and stderr
//! together) kept to the last `output_byte_limit` bytes (at most [`MAX_OUTPUT`]), and every
//! one stopped when the task ends (dropping [`Terminals`] kills what still runs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{CreateTerminalRequest, TerminalExitStatus};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::runner::process::GroupChild;

/// The most output a terminal keeps, whatever the agent asks for.
pub const MAX_OUTPUT: usize = 1 << 20;
/// The most terminals one task may have at once.
pub const MAX_TERMINALS: usize = 16;
/// After `terminal/kill` (or the task's end), how long a command gets after SIGTERM.
const GRACE: Duration = Duration::from_secs(2);

/// What a terminal printed: the last `limit` bytes.
#[derive(Default)]
struct Output {
    text: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Output {
    fn push(&mut self, bytes: &[u8]) {
        self.text.extend_from_slice(bytes);
        if self.text.len() > self.limit {
            let cut = self.text.len() - self.limit;
            self.text.drain(..cut);
            self.truncated = true;
        }
    }
}

struct Terminal {
    output: Arc<Mutex<Output>>,
    exit: watch::Receiver<Option<TerminalExitStatus>>,
    kill: CancellationToken,
}

/// A task's terminals.
pub struct Terminals {
    root: PathBuf,
    /// The commands' whole environment (beside what the agent asks for): never the bridge's
    /// own, which may hold what the agent must not see.
    env: Vec<(String, String)>,
    next: AtomicU64,
    open: Mutex<HashMap<String, Terminal>>,
    /// Stops every command when the task ends.
    stop: CancellationToken,
}

impl Drop for Terminals {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Reads a terminal's output and waits for its command (stopping its group on `kill`), then
/// tells its exit status.
async fn run(
    mut child: GroupChild,
    output: Arc<Mutex<Output>>,
    kill: CancellationToken,
    exit_tx: watch::Sender<Option<TerminalExitStatus>>,
) {
    let (stdout, stderr) = (child.child.stdout.take(), child.child.stderr.take());
    let reads = futures::future::join(
        read_into(stdout.map(|p| Box::new(p) as _), &output),
        read_into(stderr.map(|p| Box::new(p) as _), &output),
    );
    let waited = async {
        tokio::select! {
            status = child.child.wait() => status,
            _ = kill.cancelled() => child.terminate(GRACE).await,
        }
    };
    let (status, _) = tokio::join!(waited, reads);
    let _ = exit_tx.send(Some(exit_status(status)));
}

async fn read_into(
    pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
    output: &Mutex<Output>,
) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        output.lock().expect("output lock").push(&buf[..n]);
    }
}

/// An exit status in ACP's terms: the code, or the signal's name.
fn exit_status(status: std::io::Result<std::process::ExitStatus>) -> TerminalExitStatus {
    match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            TerminalExitStatus::new()
                .exit_code(status.code().map(|c| c as u32))
                .signal(status.signal().map(|s| {
                    nix::sys::signal::Signal::try_from(s)
                        .map_or_else(|_| s.to_string(), |sig| sig.as_str().to_string())
                }))
        }
        Err(_) => TerminalExitStatus::new(),
    }
}

/// Why a terminal request is refused, in words for the agent.
pub type Refusal = String;

impl Terminals {
    pub fn new(root: PathBuf, env: Vec<(String, String)>) -> Terminals {
        Terminals {
            root,
            env,
            next: AtomicU64::new(1),
            open: Mutex::new(HashMap::new()),
            stop: CancellationToken::new(),
        }
    }

    /// The folder a command runs in: the workspace, or a folder inside it.
    fn folder(&self, asked: Option<&Path>) -> Result<PathBuf, Refusal> {
        let root = self
            .root
            .canonicalize()
            .map_err(|e| format!("the workspace is not there: {e}"))?;
        let Some(asked) = asked else {
            return Ok(root);
        };
        let joined = if asked.is_absolute() {
            asked.to_path_buf()
        } else {
            root.join(asked)
        };
        let real = joined
            .canonicalize()
            .map_err(|e| format!("{}: {e}", asked.display()))?;
        if real.starts_with(&root) {
            Ok(real)
        } else {
            Err(format!(
                "{} is outside the task's workspace; terminals run inside it",
                asked.display()
            ))
        }
    }

    /// Starts a command; its id. The returned future reads its output and waits for it: the
    /// caller runs it on the connection (it ends when the command ends or the task does).
    pub fn create(
        &self,
        req: &CreateTerminalRequest,
    ) -> Result<
        (
            String,
            impl std::future::Future<Output = ()> + Send + 'static,
        ),
        Refusal,
    > {
        if self.open.lock().expect("terminals lock").len() >= MAX_TERMINALS {
            return Err(format!(
                "at most {MAX_TERMINALS} terminals at once: release one first"
            ));
        }
        let cwd = self.folder(req.cwd.as_deref())?;
        let child = self.spawn(req, &cwd)?;
        let limit = req
            .output_byte_limit
            .map_or(MAX_OUTPUT, |l| (l as usize).min(MAX_OUTPUT));
        let output = Arc::new(Mutex::new(Output {
            limit,
            ..Output::default()
        }));
        let (exit_tx, exit) = watch::channel(None);
        let kill = self.stop.child_token();
        let id = format!("term-{}", self.next.fetch_add(1, Ordering::SeqCst));
        self.open.lock().expect("terminals lock").insert(
            id.clone(),
            Terminal {
                output: output.clone(),
                exit,
                kill: kill.clone(),
            },
        );
        tracing::info!(terminal = %id, command = %req.command, pgid = child.pid(), "terminal started");
        Ok((id, run(child, output, kill, exit_tx)))
    }

    /// The command in `cwd`, in a process group of its own, with only the agent's variables
    /// and the terminals' own environment.
    fn spawn(&self, req: &CreateTerminalRequest, cwd: &Path) -> Result<GroupChild, Refusal> {
        let mut cmd = tokio::process::Command::new(&req.command);
        cmd.args(&req.args)
            .current_dir(cwd)
            .env_clear()
            .envs(req.env.iter().map(|v| (v.name.clone(), v.value.clone())))
            .envs(self.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        GroupChild::spawn(&mut cmd).map_err(|e| format!("cannot run {:?}: {e}", req.command))
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&Terminal) -> T) -> Result<T, Refusal> {
        self.open
            .lock()
            .expect("terminals lock")
            .get(id)
            .map(f)
            .ok_or_else(|| format!("no terminal {id:?}"))
    }

    /// What it printed so far, whether older output was dropped, and its exit when it ended.
    pub fn output(&self, id: &str) -> Result<(String, bool, Option<TerminalExitStatus>), Refusal> {
        self.with(id, |t| {
            let out = t.output.lock().expect("output lock");
            (
                String::from_utf8_lossy(&out.text).into_owned(),
                out.truncated,
                t.exit.borrow().clone(),
            )
        })
    }

    /// Waits for it to end.
    pub async fn wait(&self, id: &str) -> Result<TerminalExitStatus, Refusal> {
        let mut exit = self.with(id, |t| t.exit.clone())?;
        loop {
            if let Some(status) = exit.borrow_and_update().clone() {
                return Ok(status);
            }
            if exit.changed().await.is_err() {
                return Ok(TerminalExitStatus::new());
            }
        }
    }

    /// Stops the command (SIGTERM, then SIGKILL); its output stays.
    pub fn kill(&self, id: &str) -> Result<(), Refusal> {
        self.with(id, |t| t.kill.cancel())
    }

    /// Stops it if it runs and forgets it.
    pub fn release(&self, id: &str) -> Result<(), Refusal> {
        let removed = self.open.lock().expect("terminals lock").remove(id);
        match removed {
            Some(t) => {
                t.kill.cancel();
                Ok(())
            }
            None => Err(format!("no terminal {id:?}")),
        }
    }

    /// A terminal's output for a tool call's content (`None` for an unknown id).
    pub fn text(&self, id: &str) -> Option<String> {
        self.output(id).ok().map(|(text, _, _)| text)
    }
}
