//! Test servers (tests/hosts) and test agents, free ports, and a gate that cuts a port.

use super::*;

/// Starts one of the test servers in tests/hosts (`python3 SCRIPT ARGS`), which prints
/// `listening PORT` once it serves; returns it and that port then. Pass `--port 0` so the
/// server binds a port the OS picks (a port asked for first and bound later can be taken
/// meanwhile by another test).
pub fn spawn_test_server(script: &str, args: &[std::ffi::OsString]) -> (Child, u16) {
    let mut child = Command::new("python3")
        .arg(repo().join("tests/hosts").join(script))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("python3 runs tests/hosts/{script}: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .strip_prefix("listening ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("tests/hosts/{script} did not start: {line:?}"));
    (child, port)
}

/// The AAMP test host (tests/hosts/aamp_host.py) in front of the shared mail host: the helper
/// API with task streams, recording every action it receives.
pub struct AampHost {
    child: Child,
    pub url: String,
    pub record: PathBuf,
    _dir: tempfile::TempDir,
}

impl AampHost {
    pub fn start() -> AampHost {
        AampHost::start_with(&[])
    }

    /// With more arguments for tests/hosts/aamp_host.py (`--no-push`).
    pub fn start_with(extra: &[&str]) -> AampHost {
        let host = shared_host();
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("actions.jsonl");
        let jmap = host
            .jmap_url
            .trim_end_matches("/.well-known/jmap")
            .to_string();
        let mut args: Vec<std::ffi::OsString> = [
            "--port",
            "0",
            "--record",
            record.to_str().unwrap(),
            "--jmap",
            &jmap,
            "--mailhost",
            repo().join("scripts/mailhost.sh").to_str().unwrap(),
            "--domain",
            &host.domain,
            "--smtp",
            &format!("127.0.0.1:{}", host.smtp_port),
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.extend(extra.iter().map(Into::into));
        let (child, port) = spawn_test_server("aamp_host.py", &args);
        AampHost {
            child,
            url: format!("http://127.0.0.1:{port}"),
            record,
            _dir: dir,
        }
    }

    /// The actions received so far, in order.
    pub fn actions(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for AampHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port in front of the mail host's submission port that a test can close (new
/// connections are refused and open ones cut, as when the server is down) and open again.
pub struct Gate {
    pub port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    live: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Gate {
    pub fn new(target: u16) -> Gate {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let done = Arc::new(AtomicBool::new(false));
        let live = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (open2, done2, live2) = (open.clone(), done.clone(), live.clone());
        std::thread::spawn(move || {
            let mut listener = Some(listener);
            while !done2.load(Ordering::SeqCst) {
                match (&listener, open2.load(Ordering::SeqCst)) {
                    (Some(_), false) => listener = None, // closed: connections are refused
                    (None, true) => {
                        listener = std::net::TcpListener::bind(("127.0.0.1", port)).ok();
                    }
                    _ => {}
                }
                let Some(l) = &listener else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                l.set_nonblocking(true).unwrap();
                match l.accept() {
                    Ok((client, _)) => {
                        if !open2.load(Ordering::SeqCst) {
                            continue; // closed meanwhile: refused
                        }
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                            continue;
                        };
                        live2.lock().unwrap().push(client.try_clone().unwrap());
                        let (mut c2, mut s2) =
                            (client.try_clone().unwrap(), server.try_clone().unwrap());
                        let (mut c, mut s) = (client, server);
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut c, &mut s);
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        });
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut s2, &mut c2);
                            let _ = c2.shutdown(std::net::Shutdown::Both);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Gate {
            port,
            open,
            done,
            live,
        }
    }

    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        // Connections a client keeps open (an SMTP pool) are cut too.
        for stream in self.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Where `scripts/test-agents.sh` installs the third-party agents and SDKs (installing them
/// the first time).
pub fn test_agents() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("scripts/test-agents.sh"))
            .output()
            .expect("bash runs scripts/test-agents.sh");
        assert!(
            out.status.success(),
            "installing the test agents failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}
