//! `aamp-bridge profile list|show|new|test`: the agent profiles.

use crate::output::{errln, out, outln};

use super::*;

use crate::runner::stream::StreamFormat;
use crate::runner::Profile;
use crate::wizard::profile_maker::{self as maker, NewProfile, ResumeCheck};
use crate::wizard::prompt::Spinner;
use crate::wizard::Progress as _;

pub(super) async fn profile(
    config_path: &std::path::Path,
    action: ProfileAction,
) -> anyhow::Result<i32> {
    let dirs = match crate::wizard::existing(config_path)? {
        Some(c) => c.profile_dirs(),
        None => vec![crate::config::default_config_dir().join("profiles")],
    };
    match action {
        ProfileAction::List { json } => list(&dirs, json),
        ProfileAction::Show { name } => {
            let p = Profile::find(&name, &dirs)?;
            match crate::runner::profile::source_text(&name, &dirs) {
                Some(text) => out!("{text}"),
                None => bail!("profile {name} has no file to show ({})", p.origin),
            }
            Ok(0)
        }
        ProfileAction::Test {
            name,
            prompt,
            events,
            json,
        } => {
            let p = Profile::find(&name, &dirs)?;
            let spinner = Spinner::new();
            spinner.step(&format!("running {} on {prompt:?}", p.name));
            let report = maker::smoke_test_with(&p, &prompt, events).await;
            spinner.done(&format!("{} answered in {} ms", p.name, report.duration_ms));
            print_report(&report, json)?;
            Ok(if report.ok { 0 } else { 1 })
        }
        ProfileAction::New(args) => new(args, &dirs).await,
    }
}

/// `profile list`: yours first, then the built-in ones.
fn list(dirs: &[PathBuf], json: bool) -> anyhow::Result<i32> {
    let (profiles, errors) = Profile::all(dirs);
    for e in &errors {
        errln!("warning: {e}");
    }
    let kind = |p: &Profile| format!("{:?}", p.kind).to_lowercase();
    if json {
        let list: Vec<serde_json::Value> = profiles
            .iter()
            .map(|p| serde_json::json!({"name": p.name, "kind": kind(p), "command": p.command.render(&Default::default()), "description": p.description, "origin": p.origin}))
            .collect();
        outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    for p in &profiles {
        outln!(
            "{:<14} {:<4} {:<12} {}  ({})",
            p.name,
            kind(p),
            p.command.render(&Default::default()),
            p.description,
            p.origin
        );
    }
    Ok(0)
}

/// `profile new`: the profile written, its framing found by a run, smoke-tested, and whether
/// it can continue a conversation tried.
async fn new(args: NewProfileArgs, dirs: &[PathBuf]) -> anyhow::Result<i32> {
    let mut new = new_profile(&args)?;
    let spinner = Spinner::new();
    let format = framing(&new, &args, &spinner).await?;
    new.stream = Some(format);
    let mut text = maker::render(&new, format);
    let path = maker::target(dirs, &args.name);
    maker::write_with_env(&path, &text, &new.env, args.force)?;
    for warning in Profile::parse(&text, &args.name, "the new profile")?.warnings() {
        errln!("warning: {warning}");
    }
    let report = if args.no_test {
        None
    } else {
        let p = Profile::find(&path.display().to_string(), dirs)?;
        spinner.step("smoke test");
        let r = maker::smoke_test(&p, &args.test_prompt).await;
        let outcome = if r.ok { "ok" } else { "failed" };
        spinner.done(&format!("smoke test: {outcome}"));
        Some(r)
    };
    let resume = match &report {
        Some(r) if r.ok && !new.acp && !maker::resumes_already(&new) => {
            spinner.clear();
            let Some(found) = resume(&mut new, &mut text, format, &path, &args).await? else {
                return Ok(130);
            };
            Some(found)
        }
        _ => None,
    };
    let name = &args.name;
    if args.json {
        outln!(
            "{}",
            serde_json::json!({"profile": name, "path": path, "stream": format.as_str(), "test": report, "resume": resume})
        );
    } else {
        outln!("wrote {}:\n{text}", path.display());
        if let Some(r) = &report {
            print_report(r, false)?;
        }
        if let Some(r) = &resume {
            outln!("{}", r.summary());
        }
        outln!("use it: `profile = \"{name}\"` in an [[agents]] table, or pick it in `aamp-bridge init`");
    }
    Ok(match report {
        Some(r) if !r.ok => 1,
        _ => 0,
    })
}

/// The profile `profile new`'s arguments describe.
fn new_profile(args: &NewProfileArgs) -> anyhow::Result<NewProfile> {
    let name = &args.name;
    if !crate::config::valid_name(name) {
        bail!("profile name {name:?}: use lower-case letters, digits, - and _");
    }
    let env = args
        .env
        .iter()
        .map(|pair| maker::env_pair(pair))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let Some(command) = args.command.clone() else {
        bail!("give the agent's program with --command (and its arguments with --arg, `{{{{prompt}}}}` for the task's text)");
    };
    let stream = match args.stream.as_str() {
        "auto" => None,
        other => Some(
            serde_json::from_value::<StreamFormat>(serde_json::Value::String(other.into()))
                .map_err(|_| {
                    anyhow::anyhow!(
                        "--stream {other:?}: use auto, none, ndjson, sse, claude, codex or gemini"
                    )
                })?,
        ),
    };
    Ok(NewProfile {
        description: args
            .description
            .clone()
            .unwrap_or_else(|| format!("{command} (made with profile new)")),
        name: name.clone(),
        command,
        args: args.args.clone(),
        prompt_via: args.prompt_via,
        cwd: args.cwd.clone(),
        stream,
        timeout_secs: args.timeout_secs,
        acp: args.acp,
        permissions: args.permissions.clone(),
        env,
        resume_flag: None,
    })
}

/// How the new agent's output is framed: as given, none for an ACP agent or with no test
/// run, else seen in a run.
async fn framing(
    new: &NewProfile,
    args: &NewProfileArgs,
    spinner: &Spinner,
) -> anyhow::Result<StreamFormat> {
    Ok(match (new.stream, new.acp || args.no_test) {
        (Some(f), _) => f,
        (None, true) => StreamFormat::None,
        (None, false) => {
            spinner.step(&format!("running {} once to see its output", new.command));
            let f = maker::detect(new, &args.test_prompt).await?;
            spinner.done(&format!("its output is framed as: {}", f.as_str()));
            f
        }
    })
}

/// Whether it can continue a conversation: a second turn told which session to resume must
/// know what the first was told. A flag that works is written into the profile (and
/// `text`); `None` when the person interrupted the try.
async fn resume(
    new: &mut NewProfile,
    text: &mut String,
    format: StreamFormat,
    path: &std::path::Path,
    args: &NewProfileArgs,
) -> anyhow::Result<Option<ResumeCheck>> {
    let limit = std::time::Duration::from_secs(args.resume_try_secs.max(1));
    let progress = |line: &str| errln!("{line}");
    let check = maker::find_resume_flag(new, format, limit, &progress);
    // Ctrl-C drops the try, whose process group goes with it, instead of leaving the agent
    // running after this command is gone.
    let found = tokio::select! {
        found = check => found,
        _ = tokio::signal::ctrl_c() => {
            errln!("interrupted; the try was stopped and {} written without a resume flag", path.display());
            return Ok(None);
        }
    };
    if let Some(flag) = &found.flag {
        new.resume_flag = Some(flag.clone());
        *text = maker::render(new, format);
        maker::write_with_env(path, text, &new.env, true)?;
    }
    Ok(Some(found))
}

pub(super) fn print_report(
    report: &crate::wizard::profile_maker::Report,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        outln!("{}", crate::events::json_text(report)?);
        return Ok(());
    }
    if report.ok {
        outln!("OK    answered in {} ms", report.duration_ms);
    } else {
        outln!("FAIL  {}", report.error.as_deref().unwrap_or("no answer"));
    }
    for (n, event) in report.stream.iter().enumerate() {
        outln!(
            "{:>5}. {:<11} {}",
            n + 1,
            event["type"].as_str().unwrap_or_default(),
            event["payload"]
        );
    }
    if !report.events.is_empty() {
        let events: Vec<String> = report
            .events
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect();
        outln!("      stream events: {}", events.join(", "));
    }
    let shown: String = report.output.chars().take(500).collect();
    if !shown.is_empty() {
        outln!("      answer: {}", shown.trim());
    }
    Ok(())
}
