//! Their agent commands as our profiles: an `acpCommand` as the ACP profile that runs the same
//! agent, a CLI profile of theirs (named, inline or built in) as a profile file of ours, with
//! their placeholders in ours.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CliProfile {
    description: Option<String>,
    command: String,
    #[serde(default)]
    args: Vec<String>,
    stdin: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    #[serde(default)]
    shell: bool,
    timeout_ms: Option<u64>,
    success_exit_codes: Option<Vec<i32>>,
    stream: Option<CliStream>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct CliStream {
    format: String,
    #[serde(default = "yes")]
    enabled: bool,
}

fn yes() -> bool {
    true
}

/// Their built-in CLI profiles that have no namesake here (exact argv from their code).
pub(super) fn their_builtin(name: &str) -> Option<CliProfile> {
    let (command, args, sse): (&str, &[&str], bool) = match name {
        "coco" => (
            "coco",
            &["-p", "{{prompt}}", "--yolo", "--resume", "{{sessionKey}}"],
            false,
        ),
        "codem" => (
            "codem",
            &[
                "-p",
                "{{prompt}}",
                "--sse",
                "--yolo",
                "--session",
                "{{safeSessionKey}}",
            ],
            true,
        ),
        _ => return None,
    };
    Some(CliProfile {
        command: command.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        stream: sse.then(|| CliStream {
            format: "sse".into(),
            enabled: true,
        }),
        ..CliProfile::default()
    })
}

/// Their placeholders in ours.
fn template(text: &str) -> String {
    text.replace("{{agentName}}", "{{agent}}")
        .replace("{{safeSessionKey}}", "{{safe_session_key}}")
        .replace("{{sessionKey}}", "{{session_key}}")
}

pub(super) fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A CLI profile of theirs as a profile file of ours.
pub(super) fn profile_toml(name: &str, p: &CliProfile, notes: &mut Vec<String>) -> String {
    let mut out = format!(
        "# Imported from the aamp-cli-bridge profile {name:?}.\nname = {}\n",
        toml_string(name)
    );
    if let Some(d) = &p.description {
        out.push_str(&format!("description = {}\n", toml_string(d)));
    }
    let (command, mut args) = if p.shell {
        notes.push(format!("profile {name}: `shell: true` is not carried over: the bridge never runs a shell, so the command line is split on white space (check it)"));
        let mut words = p.command.split_whitespace().map(str::to_string);
        (words.next().unwrap_or_default(), words.collect::<Vec<_>>())
    } else {
        (p.command.clone(), Vec::new())
    };
    args.extend(p.args.iter().cloned());
    out.push_str(&format!("command = {}\n", toml_string(&template(&command))));
    let args: Vec<String> = args.iter().map(|a| toml_string(&template(a))).collect();
    out.push_str(&format!("args = [{}]\n", args.join(", ")));
    if let Some(stdin) = &p.stdin {
        out.push_str(&format!("stdin = {}\n", toml_string(&template(stdin))));
    }
    if let Some(cwd) = &p.cwd {
        out.push_str(&format!("cwd = {}\n", toml_string(&template(cwd))));
    }
    if !p.env.is_empty() {
        out.push_str("env = { ");
        let pairs: Vec<String> = p
            .env
            .iter()
            .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(&template(v))))
            .collect();
        out.push_str(&pairs.join(", "));
        out.push_str(" }\n");
    }
    let secs = p.timeout_ms.unwrap_or(1_800_000).div_ceil(1000).max(1);
    out.push_str(&format!("timeout_secs = {secs}\n"));
    if let Some(codes) = &p.success_exit_codes {
        let codes: Vec<String> = codes.iter().map(|c| c.to_string()).collect();
        out.push_str(&format!("success_exit_codes = [{}]\n", codes.join(", ")));
    }
    if let Some(stream) = p.stream.as_ref().filter(|s| s.enabled) {
        match stream.format.as_str() {
            "sse" | "ndjson" => out.push_str(&format!("stream = \"{}\"\n", stream.format)),
            other => notes.push(format!(
                "profile {name}: stream format {other:?} is unknown; read as plain text"
            )),
        }
    }
    out
}

/// An ACP command line as one of our ACP profiles, when one runs the same agent.
pub(super) fn acp_profile(command: &str) -> Option<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    // Agents whose adapter was renamed since the reference bridges' docs were written.
    const RENAMED: &[(&str, &str)] = &[
        ("claude-code-acp", "claude-acp"),
        ("@zed-industries/claude-code-acp", "claude-acp"),
        ("@zed-industries/codex-acp", "codex-acp"),
    ];
    if let Some((_, profile)) = RENAMED.iter().find(|(old, _)| {
        words.iter().any(|w| {
            w == old
                || Path::new(w).file_name().and_then(|f| f.to_str()) == Some(*old)
                || w.starts_with(&format!("{old}@"))
        })
    }) {
        return Some(profile.to_string());
    }
    let (profiles, _) = crate::runner::Profile::all(&[]);
    for p in profiles
        .iter()
        .filter(|p| p.kind == crate::runner::profile::ProfileKind::Acp)
    {
        let ours = p.command.render(&Default::default());
        let ours_args: Vec<String> = p
            .args
            .iter()
            .map(|a| a.render(&Default::default()))
            .collect();
        let same_command = words.first().map(|w| {
            Path::new(w).file_name().and_then(|f| f.to_str())
                == Path::new(&ours).file_name().and_then(|f| f.to_str())
        }) == Some(true);
        // npx @scope/package: the package names the agent.
        let same_package = words
            .iter()
            .skip(1)
            .any(|w| w.starts_with('@') && ours_args.iter().any(|a| a.contains(w)))
            || words
                .iter()
                .skip(1)
                .any(|w| w.starts_with('@') && w.contains(&ours));
        if same_command && words.len() == 1 + ours_args.len() || same_package {
            return Some(p.name.clone());
        }
    }
    None
}
