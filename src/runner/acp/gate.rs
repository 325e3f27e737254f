//! One decision for every way an ACP agent acts through the bridge: a permission request
//! ([`super::permissions`]), a command in one of our terminals, a file written or read. The
//! policy decides each the same way, and what it does not allow is refused, whatever the
//! agent says it asked before:
//!
//! | policy      | permission request      | `terminal/create` | `fs/write_text_file` | `fs/read_text_file` |
//! |-------------|-------------------------|-------------------|----------------------|---------------------|
//! | `allow`     | allowed                 | runs              | written              | read                |
//! | `read_only` | read/search/think only  | refused           | refused              | read                |
//! | `deny`      | refused                 | refused           | refused              | refused             |
//! | `ask`       | asked by mail           | asked by mail     | asked by mail        | read                |
//!
//! `ask` with nobody to ask behaves as `read_only`. What is refused is not offered in
//! `initialize` either ([`offered`]). Every refusal is kept ([`Refusals`]), so the task's
//! answer says what the agent was not allowed to do.

use std::sync::Mutex;

use super::PermissionPolicy;

/// An action an agent asks the bridge to carry out for it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Act {
    Terminal,
    Write,
    Read,
}

/// What the policy says of an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Go,
    /// Ask whoever answers questions.
    Ask,
    /// Refused, and why, in words for the agent.
    Refuse(String),
}

/// What the client offers in `initialize` under `policy`: (read files, write files,
/// terminals). `asking`: someone answers questions.
pub(super) fn offered(policy: PermissionPolicy, asking: bool) -> (bool, bool, bool) {
    let acts = |act| !matches!(verdict(policy, asking, act), Verdict::Refuse(_));
    (acts(Act::Read), acts(Act::Write), acts(Act::Terminal))
}

/// The policy's verdict on `act`.
pub(super) fn verdict(policy: PermissionPolicy, asking: bool, act: Act) -> Verdict {
    let name = policy_name(policy);
    match (policy, act) {
        (PermissionPolicy::Allow, _) => Verdict::Go,
        (PermissionPolicy::Deny, Act::Read) => Verdict::Refuse(format!(
            "permissions = \"{name}\": the bridge reads no file for the agent"
        )),
        (_, Act::Read) => Verdict::Go,
        (PermissionPolicy::Ask, _) if asking => Verdict::Ask,
        (_, Act::Terminal) => Verdict::Refuse(format!(
            "permissions = \"{name}\": the bridge runs no command for the agent"
        )),
        (_, Act::Write) => Verdict::Refuse(format!(
            "permissions = \"{name}\": the bridge writes no file for the agent"
        )),
    }
}

pub(super) fn policy_name(policy: PermissionPolicy) -> &'static str {
    match policy {
        PermissionPolicy::Allow => "allow",
        PermissionPolicy::ReadOnly => "read_only",
        PermissionPolicy::Deny => "deny",
        PermissionPolicy::Ask => "ask",
    }
}

/// The most refusals a task keeps (the answer names the first ones and counts the rest).
const MAX_REFUSALS: usize = 20;

/// What was refused during a task, in order.
#[derive(Default)]
pub(super) struct Refusals {
    said: Mutex<(Vec<String>, usize)>,
}

impl Refusals {
    pub(super) fn add(&self, what: String) {
        let mut said = self.said.lock().expect("refusals lock");
        said.1 += 1;
        if said.0.len() < MAX_REFUSALS && !said.0.contains(&what) {
            said.0.push(what);
        }
    }

    /// The refusals in one sentence, `None` when there were none.
    pub(super) fn summary(&self) -> Option<String> {
        let said = self.said.lock().expect("refusals lock");
        if said.1 == 0 {
            return None;
        }
        let mut text = said.0.join("; ");
        let more = said.1.saturating_sub(said.0.len());
        if more > 0 {
            text.push_str(&format!(" (and {more} more)"));
        }
        Some(text)
    }
}

/// Commands a person allowed by name in a permission request ("Run `make test`"): a
/// terminal for exactly that command is then not asked about again, once.
#[derive(Default)]
pub(super) struct Granted {
    commands: Mutex<Vec<String>>,
    /// "Always allow" was chosen for commands, or for edits.
    always_run: std::sync::atomic::AtomicBool,
    always_write: std::sync::atomic::AtomicBool,
}

impl Granted {
    pub(super) fn command(&self, command: String) {
        let mut commands = self.commands.lock().expect("granted lock");
        if commands.len() < 16 {
            commands.push(command);
        }
    }

    /// Uses up a grant for `command`, if there is one.
    pub(super) fn take_command(&self, command: &str) -> bool {
        let mut commands = self.commands.lock().expect("granted lock");
        match commands.iter().position(|c| c == command) {
            Some(i) => {
                commands.remove(i);
                true
            }
            None => false,
        }
    }

    pub(super) fn always(&self, act: Act) -> bool {
        use std::sync::atomic::Ordering;
        match act {
            Act::Terminal => self.always_run.load(Ordering::SeqCst),
            Act::Write => self.always_write.load(Ordering::SeqCst),
            Act::Read => true,
        }
    }

    pub(super) fn set_always(&self, act: Act) {
        use std::sync::atomic::Ordering;
        match act {
            Act::Terminal => self.always_run.store(true, Ordering::SeqCst),
            Act::Write => self.always_write.store(true, Ordering::SeqCst),
            Act::Read => {}
        }
    }
}

/// A command as one line: the program and its arguments, each quoted when it needs it.
pub(super) fn command_line(command: &str, args: &[String]) -> String {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .map(|word| {
            if !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                word.to_string()
            } else {
                format!("'{}'", word.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A command named in a tool call's input (`{"command": "make test"}` or
/// `{"command": ["make", "test"]}`), as [`command_line`] writes it.
pub(super) fn command_of(input: Option<&serde_json::Value>) -> Option<String> {
    let command = input?.get("command")?;
    match command {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(words) => {
            let words: Vec<String> = words
                .iter()
                .map(|w| w.as_str().map(str::to_string))
                .collect::<Option<_>>()?;
            let (first, rest) = words.split_first()?;
            Some(command_line(first, rest))
        }
        _ => None,
    }
}

/// Local detail kept out of what is mailed to the sender: the workspace's path (a path inside
/// it is given relative to it) and the home folder.
pub(super) fn redact(text: &str, workspace: &std::path::Path) -> String {
    let ws = workspace.display().to_string();
    let mut text = if ws.len() > 1 {
        text.replace(&format!("{ws}/"), "")
            .replace(&ws, "the task's workspace")
    } else {
        text.to_string()
    };
    if let Some(home) = std::env::var_os("HOME").map(|h| h.to_string_lossy().into_owned()) {
        if home.len() > 1 {
            text = text.replace(&home, "~");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_decides_every_act() {
        use Act::*;
        use PermissionPolicy::*;
        let go = |p, asking, act| verdict(p, asking, act) == Verdict::Go;
        let refused = |p, asking, act| matches!(verdict(p, asking, act), Verdict::Refuse(_));
        for act in [Terminal, Write, Read] {
            assert!(go(Allow, false, act));
            assert!(refused(Deny, true, act));
        }
        assert!(refused(ReadOnly, true, Terminal) && refused(ReadOnly, true, Write));
        assert!(go(ReadOnly, false, Read) && go(Ask, true, Read));
        assert_eq!(verdict(Ask, true, Terminal), Verdict::Ask);
        assert_eq!(verdict(Ask, true, Write), Verdict::Ask);
        // Nobody to ask: as read_only.
        assert!(refused(Ask, false, Terminal) && refused(Ask, false, Write));
        assert_eq!(offered(ReadOnly, true), (true, false, false));
        assert_eq!(offered(Deny, true), (false, false, false));
        assert_eq!(offered(Ask, true), (true, true, true));
        assert_eq!(offered(Ask, false), (true, false, false));
        assert_eq!(offered(Allow, false), (true, true, true));
    }

    #[test]
    fn commands_are_named_as_a_person_reads_them() {
        assert_eq!(
            command_line("sh", &["-c".into(), "echo 'hi' > x".into()]),
            "sh -c 'echo '\\''hi'\\'' > x'"
        );
        assert_eq!(
            command_of(Some(&serde_json::json!({"command": ["make", "test"]}))).as_deref(),
            Some("make test")
        );
        assert_eq!(
            command_of(Some(&serde_json::json!({"command": "make test"}))).as_deref(),
            Some("make test")
        );
    }

    #[test]
    fn the_workspace_path_is_not_mailed() {
        let ws = std::path::Path::new("/var/lib/x/workspaces/ab12");
        assert_eq!(
            redact("Always allow in /var/lib/x/workspaces/ab12", ws),
            "Always allow in the task's workspace"
        );
        assert_eq!(
            redact("Edit /var/lib/x/workspaces/ab12/src/main.rs", ws),
            "Edit src/main.rs"
        );
    }

    #[test]
    fn refusals_are_bounded_and_counted() {
        let r = Refusals::default();
        assert_eq!(r.summary(), None);
        for i in 0..30 {
            r.add(format!("thing {i}"));
        }
        let s = r.summary().unwrap();
        assert!(
            s.starts_with("thing 0; thing 1") && s.ends_with("(and 10 more)"),
            "{s}"
        );
    }
}
