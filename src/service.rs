//! The bridge as a background service: a systemd user unit on Linux, a launchd agent on
//! macOS, rendered from the top-level `systemd/` and `launchd/` templates with this binary,
//! the config file and the installing shell's PATH. A thin shell over `systemctl` and
//! `launchctl`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

const UNIT: &str = include_str!("../systemd/aamp-bridge.service");
const PLIST: &str = include_str!("../launchd/aamp-bridge.plist");
const LABEL: &str = "com.aamp-bridge";

/// Where and how the service is installed.
#[derive(Clone, Debug)]
pub struct Service {
    pub kind: Kind,
    /// The unit or plist file.
    pub file: PathBuf,
    pub exe: PathBuf,
    pub config: PathBuf,
    pub path_env: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Systemd,
    Launchd,
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `value` with `{{key}}` replaced; values are paths and PATH, written as they are.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    values.iter().fold(template.to_string(), |text, (k, v)| {
        text.replace(&format!("{{{{{k}}}}}"), v)
    })
}

/// XML text escaping for the plist.
fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Service {
    /// The service for this machine (or, with `launchd`, the macOS agent whatever the
    /// machine), this binary and `config`.
    pub fn for_this_machine(config: &Path, launchd: bool) -> anyhow::Result<Service> {
        let exe = std::env::current_exe().context("finding this program's own path")?;
        let config = config
            .canonicalize()
            .with_context(|| format!("the config {} does not exist", config.display()))?;
        let path_env =
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        let (kind, file) = if cfg!(target_os = "macos") || launchd {
            (
                Kind::Launchd,
                home()
                    .join("Library/LaunchAgents")
                    .join(format!("{LABEL}.plist")),
            )
        } else {
            let base = std::env::var_os("XDG_CONFIG_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| home().join(".config"));
            (Kind::Systemd, base.join("systemd/user/aamp-bridge.service"))
        };
        Ok(Service {
            kind,
            file,
            exe,
            config,
            path_env,
        })
    }

    /// The unit or plist text.
    pub fn render(&self) -> String {
        let exe = self.exe.display().to_string();
        let config = self.config.display().to_string();
        match self.kind {
            Kind::Systemd => fill(
                UNIT,
                &[
                    ("exe", &systemd_quote(&exe)),
                    ("config", &systemd_quote(&config)),
                    ("path", &self.path_env),
                ],
            ),
            Kind::Launchd => {
                let logs = home()
                    .join("Library/Logs/aamp-bridge")
                    .display()
                    .to_string();
                fill(
                    PLIST,
                    &[
                        ("label", LABEL),
                        ("exe", &xml(&exe)),
                        ("config", &xml(&config)),
                        ("path", &xml(&self.path_env)),
                        ("logs", &xml(&logs)),
                    ],
                )
            }
        }
    }

    /// Whether this machine's service manager can be reached now (a systemd user manager, or
    /// launchd), so offering to install makes sense.
    pub fn available(&self) -> bool {
        match self.kind {
            Kind::Systemd => Command::new("systemctl")
                .args(["--user", "show-environment"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            Kind::Launchd => true,
        }
    }

    /// Writes the file (unchanged when it is already the same) and registers it with the
    /// service manager. Returns whether anything changed.
    pub fn install(&self) -> anyhow::Result<bool> {
        let text = self.render();
        let changed = !std::fs::read_to_string(&self.file).is_ok_and(|t| t == text);
        if changed {
            crate::fsio::write_atomic(&self.file, text.as_bytes(), 0o644)
                .with_context(|| format!("writing {}", self.file.display()))?;
        }
        // Registered every time: a run whose registration failed (no user manager then)
        // wrote the same file, and running again once there is one must still enable it.
        match self.kind {
            Kind::Systemd => {
                manager(&["--user", "daemon-reload"])?;
                manager(&["--user", "enable", "aamp-bridge.service"])?;
            }
            Kind::Launchd => std::fs::create_dir_all(home().join("Library/Logs/aamp-bridge"))?,
        }
        Ok(changed)
    }

    /// Disables and stops the service and removes the user's own unit. A package's unit stays
    /// (removing the package removes it), disabled and stopped. Returns whether there was one.
    pub fn uninstall(&self) -> anyhow::Result<bool> {
        if !self.file.exists() {
            if self.packaged().is_some() {
                manager(&["--user", "disable", "--now", "aamp-bridge.service"])?;
                return Ok(true);
            }
            return Ok(false);
        }
        if self.kind == Kind::Systemd {
            let _ = manager(&["--user", "disable", "--now", "aamp-bridge.service"]);
        } else {
            let _ = self.launchctl("bootout");
        }
        std::fs::remove_file(&self.file)?;
        if self.kind == Kind::Systemd {
            let _ = manager(&["--user", "daemon-reload"]);
        }
        Ok(true)
    }

    pub fn start(&self) -> anyhow::Result<()> {
        match self.kind {
            Kind::Systemd => manager(&["--user", "start", "aamp-bridge.service"]),
            // `bootstrap` of a loaded agent fails ("Bootstrap failed: 5: Input/output
            // error"): a loaded one is started again with `kickstart` instead.
            Kind::Launchd if self.loaded() => {
                let uid = nix::unistd::getuid();
                run("launchctl", &["kickstart", &format!("gui/{uid}/{LABEL}")])
            }
            Kind::Launchd => self.launchctl("bootstrap"),
        }
    }

    pub fn stop(&self) -> anyhow::Result<()> {
        match self.kind {
            Kind::Systemd => manager(&["--user", "stop", "aamp-bridge.service"]),
            Kind::Launchd => self.launchctl("bootout"),
        }
    }

    /// SIGHUP to the running service: the config, profiles and credentials are read again.
    pub fn reload(&self) -> anyhow::Result<()> {
        match self.kind {
            Kind::Systemd => manager(&["--user", "reload", "aamp-bridge.service"]),
            Kind::Launchd => {
                let uid = nix::unistd::getuid();
                run(
                    "launchctl",
                    &["kill", "SIGHUP", &format!("gui/{uid}/{LABEL}")],
                )
            }
        }
    }

    fn launchctl(&self, verb: &str) -> anyhow::Result<()> {
        let uid = nix::unistd::getuid();
        let target = format!("gui/{uid}");
        run(
            "launchctl",
            &[verb, &target, &self.file.display().to_string()],
        )
    }

    /// The unit a package installed (the .deb puts it in /usr/lib/systemd/user), where the
    /// systemd user manager looks for it: /usr/lib/systemd/user, /lib/systemd/user, then
    /// `$XDG_DATA_DIRS/systemd/user`. `None` on macOS, or when no package installed one.
    pub fn packaged(&self) -> Option<PathBuf> {
        if self.kind != Kind::Systemd {
            return None;
        }
        let data_dirs = std::env::var("XDG_DATA_DIRS")
            .ok()
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| "/usr/local/share:/usr/share".into());
        ["/usr/lib", "/lib"]
            .iter()
            .map(PathBuf::from)
            .chain(std::env::split_paths(&data_dirs))
            .map(|d| d.join("systemd/user/aamp-bridge.service"))
            .find(|p| p.is_file())
    }

    /// The unit systemd runs: the user's own (`service install`), which shadows a package's,
    /// else the package's.
    pub fn effective_file(&self) -> Option<PathBuf> {
        if self.file.is_file() {
            Some(self.file.clone())
        } else {
            self.packaged()
        }
    }

    /// What is wrong with the installed file, with the fix: missing, or pointing at another
    /// binary or config than this one.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = self.file_problems();
        let installed = self.file.is_file() || self.packaged().is_some();
        if installed {
            problems.extend(self.state_problems());
        }
        problems
    }

    /// Whether the service manager has the service enabled and running: a unit that is
    /// written but not enabled (a failed install) or not running is a problem too, with the
    /// manager's own words.
    pub fn state_problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        match self.kind {
            Kind::Systemd => {
                let ask = |verb: &str| {
                    Command::new("systemctl")
                        .args(["--user", verb, "aamp-bridge.service"])
                        .output()
                        .map(|o| {
                            let said = String::from_utf8_lossy(&o.stdout).trim().to_string();
                            let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
                            (said, err)
                        })
                };
                if !self.available() {
                    problems.push((
                        "the systemd user manager does not answer here, so the service neither starts nor runs".to_string(),
                        "log in normally (a desktop or SSH session), or as root: `loginctl enable-linger $USER` so it runs without a login".to_string(),
                    ));
                    return problems;
                }
                match ask("is-enabled") {
                    Ok((said, _))
                        if matches!(said.as_str(), "enabled" | "enabled-runtime" | "linked") => {}
                    Ok((said, err)) => problems.push((
                        format!(
                            "the service is not enabled ({}): it will not start at login",
                            if said.is_empty() { err } else { said }
                        ),
                        "aamp-bridge service install (enables it)".to_string(),
                    )),
                    Err(e) => problems.push((
                        format!("cannot run systemctl: {e}"),
                        "install systemd, or run `aamp-bridge start` in a terminal".to_string(),
                    )),
                }
                match ask("is-active") {
                    Ok((said, _)) if matches!(said.as_str(), "active" | "reloading" | "activating") => {}
                    Ok((said, err)) => problems.push((
                        format!(
                            "the service is not running ({})",
                            if said.is_empty() { err } else { said }
                        ),
                        "aamp-bridge service start; `aamp-bridge service logs` shows why it stopped".to_string(),
                    )),
                    Err(_) => {}
                }
            }
            Kind::Launchd => {
                if !self.loaded() {
                    problems.push((
                        format!("launchd has not loaded {LABEL}: it is not running"),
                        "aamp-bridge service start; `aamp-bridge service logs` shows why it stopped".to_string(),
                    ));
                }
            }
        }
        problems
    }

    /// Whether launchd has the agent loaded (`launchctl print` knows it).
    fn loaded(&self) -> bool {
        let uid = nix::unistd::getuid();
        Command::new("launchctl")
            .args(["print", &format!("gui/{uid}/{LABEL}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// What is wrong with the file itself.
    fn file_problems(&self) -> Vec<(String, String)> {
        let Ok(text) = std::fs::read_to_string(&self.file) else {
            if let Some(packaged) = self.packaged() {
                return self.packaged_problems(&packaged);
            }
            return vec![(
                format!(
                    "no service is installed ({} is missing)",
                    self.file.display()
                ),
                "aamp-bridge service install".into(),
            )];
        };
        let mut problems = Vec::new();
        let text = match self.kind {
            Kind::Systemd => expand_specifiers(&text),
            Kind::Launchd => text,
        };
        if text != self.render() {
            let exe = self.exe.display().to_string();
            let config = self.config.display().to_string();
            let (same_exe, same_config) = match self.kind {
                Kind::Systemd => match exec_start(&text) {
                    Some((run, with)) => (
                        same_path(&run, &self.exe),
                        same_path(
                            &with.unwrap_or_else(crate::config::default_config_path),
                            &self.config,
                        ),
                    ),
                    None => (false, false),
                },
                Kind::Launchd => (text.contains(&exe), text.contains(&config)),
            };
            if !same_exe {
                problems.push((
                    format!(
                        "{} starts another aamp-bridge binary than {exe}",
                        self.file.display()
                    ),
                    "aamp-bridge service install (it rewrites the file for this binary)".into(),
                ));
            }
            if !same_config {
                problems.push((
                    format!("{} uses another config than {config}", self.file.display()),
                    format!("aamp-bridge --config {config} service install"),
                ));
            }
            // A packaged unit (the tarball installs one) runs the right binary with its own
            // PATH: not a problem.
            if problems.is_empty() && !text.contains(PACKAGED_MARK) {
                problems.push((
                    format!(
                        "{} differs from what this version writes (PATH or settings)",
                        self.file.display()
                    ),
                    "aamp-bridge service install".into(),
                ));
            }
        }
        problems
    }
}

impl Service {
    /// The package's unit runs its binary with the default config: what differs from this
    /// binary and config, with the fix.
    fn packaged_problems(&self, packaged: &Path) -> Vec<(String, String)> {
        let text = expand_specifiers(&std::fs::read_to_string(packaged).unwrap_or_default());
        let mut problems = Vec::new();
        let exe = self.exe.display().to_string();
        if !exec_start(&text).is_some_and(|(run, _)| same_path(&run, &self.exe)) {
            problems.push((
                format!("the package's unit {} starts another aamp-bridge binary than {exe}", packaged.display()),
                "aamp-bridge service install (writes a unit of your own for this binary, which systemd then uses instead)".into(),
            ));
        }
        let default = crate::config::default_config_path();
        let same = default.canonicalize().is_ok_and(|d| d == self.config);
        if !same {
            problems.push((
                format!(
                    "the package's unit {} uses the default config {}, not {}",
                    packaged.display(),
                    default.display(),
                    self.config.display()
                ),
                format!(
                    "aamp-bridge --config {} service install (a unit of your own for this config)",
                    self.config.display()
                ),
            ));
        }
        problems
    }
}

/// The header line `scripts/package.sh` writes into the units it packages (the .deb's and the
/// tarball's).
const PACKAGED_MARK: &str = "# aamp-bridge as a systemd user service (installed by the package)";

/// A unit's text with the systemd specifiers a user unit's paths use expanded as the user
/// manager does (`%h` home, `%u` user name, `%U` uid, `%%`), so a unit that says
/// `%h/.local/bin/aamp-bridge` is compared as the path systemd runs.
fn expand_specifiers(text: &str) -> String {
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    expand_with(text, &home().display().to_string(), &user, &uid.to_string())
}

fn expand_with(text: &str, home: &str, user: &str, uid: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(home),
            Some('u') => out.push_str(user),
            Some('U') => out.push_str(uid),
            Some('%') => out.push('%'),
            // Others stay as written: they are not in the units the bridge writes.
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The program a unit's `ExecStart=` runs and the `--config` it gives (none: the default),
/// its words split as systemd splits them (double quotes, backslash escapes).
fn exec_start(text: &str) -> Option<(PathBuf, Option<PathBuf>)> {
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))?;
    let line = line.trim_start_matches(['-', '@', ':', '+', '!']);
    let words = split_words(line);
    let program = PathBuf::from(words.first()?);
    let mut config = None;
    let mut rest = words.iter().skip(1);
    while let Some(word) = rest.next() {
        if word == "--config" {
            config = rest.next().map(PathBuf::from);
        } else if let Some(value) = word.strip_prefix("--config=") {
            config = Some(PathBuf::from(value));
        }
    }
    Some((program, config))
}

fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut started) = (false, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                word.extend(chars.next());
                started = true;
            }
            '"' => {
                quoted = !quoted;
                started = true;
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// Whether two paths name one file (both resolved when they exist).
fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// A value quoted for a systemd command line when it holds spaces.
fn systemd_quote(value: &str) -> String {
    if value.contains([' ', '"', '\\']) {
        format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        value.to_string()
    }
}

/// Logs above this are rotated (to `.1`) when the bridge starts under launchd, which never
/// rotates what it writes to StandardErrorPath.
const LAUNCHD_LOG_MAX: u64 = 10 * 1024 * 1024;
/// launchd starts a failing agent again every ThrottleInterval with no limit; the bridge
/// counts its own starts and stops the loop at this many within [`LAUNCHD_LOOP_WINDOW`].
const LAUNCHD_LOOP_STARTS: usize = 10;
const LAUNCHD_LOOP_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// What `start` does first when launchd started it (`XPC_SERVICE_NAME` is the agent's
/// label): rotates its logs, and counts this start. `Some(why)` when this is a crash loop
/// (the 10th start in 5 minutes): the bridge should then say why and exit 0, which
/// KeepAlive's `SuccessfulExit = false` does not restart, as systemd's StartLimitBurst
/// stops a unit.
pub fn launchd_start() -> Option<String> {
    if std::env::var("XPC_SERVICE_NAME").ok().as_deref() != Some(LABEL) {
        return None;
    }
    let logs = home().join("Library/Logs/aamp-bridge");
    for name in ["aamp-bridge.log", "aamp-bridge.out.log"] {
        let file = logs.join(name);
        if std::fs::metadata(&file).is_ok_and(|m| m.len() > LAUNCHD_LOG_MAX) {
            // Copied, then emptied in place: launchd holds the file open (for appending).
            let kept = logs.join(format!("{name}.1"));
            if std::fs::copy(&file, &kept).is_ok() {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .and_then(|f| f.set_len(0));
            }
        }
    }
    let starts_file = logs.join("starts");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut starts: Vec<u64> = std::fs::read_to_string(&starts_file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|t| now.saturating_sub(*t) < LAUNCHD_LOOP_WINDOW.as_secs())
        .collect();
    starts.push(now);
    if starts.len() >= LAUNCHD_LOOP_STARTS {
        let _ = std::fs::remove_file(&starts_file);
        return Some(format!(
            "launchd started the bridge {} times in {} minutes: it keeps failing, so it stops here instead of starting again every few seconds; the lines before this say why. Fix that, then `aamp-bridge service start`",
            starts.len(),
            LAUNCHD_LOOP_WINDOW.as_secs() / 60
        ));
    }
    let text: String = starts.iter().map(|t| format!("{t}\n")).collect();
    let _ = std::fs::create_dir_all(&logs);
    let _ = crate::fsio::write_atomic(&starts_file, text.as_bytes(), 0o600);
    None
}

fn manager(args: &[&str]) -> anyhow::Result<()> {
    run("systemctl", args)
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let hint = if why.contains("bus") || why.contains("No medium") {
            "; there is no systemd user manager in this session (log in normally, or run `loginctl enable-linger $USER` as root so it runs without a login)"
        } else {
            ""
        };
        bail!("{program} {} failed: {why}{hint}", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(kind: Kind) -> Service {
        Service {
            kind,
            file: PathBuf::from("/nonexistent/unit"),
            exe: PathBuf::from("/opt/aamp bridge/aamp-bridge"),
            config: PathBuf::from("/home/a/.config/aamp-bridge/config.toml"),
            path_env: "/home/a/.nvm/bin:/usr/bin".into(),
        }
    }

    #[test]
    fn the_unit_and_the_plist_are_filled_in() {
        let unit = service(Kind::Systemd).render();
        assert!(!unit.contains("{{"), "{unit}");
        assert!(unit.contains(
            "ExecStart=\"/opt/aamp bridge/aamp-bridge\" --config /home/a/.config/aamp-bridge/config.toml start"
        ));
        assert!(unit.contains("Environment=PATH=/home/a/.nvm/bin:/usr/bin"));
        let plist = service(Kind::Launchd).render();
        assert!(!plist.contains("{{"), "{plist}");
        assert!(plist.contains("<string>/opt/aamp bridge/aamp-bridge</string>"));
    }

    #[test]
    fn a_missing_or_foreign_unit_is_a_problem_with_its_fix() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = service(Kind::Systemd);
        s.file = dir.path().join("aamp-bridge.service");
        assert!(s.file_problems()[0].1.contains("service install"));
        std::fs::write(&s.file, s.render()).unwrap();
        assert!(s.file_problems().is_empty());
        std::fs::write(&s.file, s.render().replace("/opt/aamp bridge/", "/old/")).unwrap();
        let problems = s.file_problems();
        assert!(
            problems[0].0.contains("another aamp-bridge binary"),
            "{problems:?}"
        );
    }

    /// Issue 43: the tarball's unit says `%h/.local/bin/aamp-bridge start`; systemd runs
    /// the home's binary with the default config.
    #[test]
    fn specifiers_are_expanded_and_exec_start_is_read_as_systemd_splits_it() {
        assert_eq!(
            expand_with("%h/.local/bin/x %u %U 100%% %t", "/home/a", "a", "1000"),
            "/home/a/.local/bin/x a 1000 100% %t"
        );
        let unit = "[Service]\nExecStart=\"/opt/a b/aamp-bridge\" --config /c.toml start\n";
        assert_eq!(
            exec_start(unit),
            Some((
                PathBuf::from("/opt/a b/aamp-bridge"),
                Some(PathBuf::from("/c.toml"))
            ))
        );
        assert_eq!(
            exec_start("ExecStart=/home/a/.local/bin/aamp-bridge start"),
            Some((PathBuf::from("/home/a/.local/bin/aamp-bridge"), None))
        );
    }
}
