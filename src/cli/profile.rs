//! `aamp-bridge profile list|show|new|test`: the agent profiles.

use crate::output::{errln, out, outln};

use super::*;

pub(super) async fn profile(
    config_path: &std::path::Path,
    action: ProfileAction,
) -> anyhow::Result<i32> {
    use crate::runner::Profile;
    use crate::wizard::profile_maker as maker;
    let dirs = match crate::wizard::existing(config_path)? {
        Some(c) => c.profile_dirs(),
        None => vec![crate::config::default_config_dir().join("profiles")],
    };
    match action {
        ProfileAction::List { json } => {
            let (profiles, errors) = Profile::all(&dirs);
            for e in &errors {
                errln!("warning: {e}");
            }
            if json {
                let list: Vec<serde_json::Value> = profiles
                    .iter()
                    .map(|p| serde_json::json!({"name": p.name, "kind": format!("{:?}", p.kind).to_lowercase(), "command": p.command.render(&Default::default()), "description": p.description, "origin": p.origin}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for p in &profiles {
                    outln!(
                        "{:<14} {:<4} {:<12} {}  ({})",
                        p.name,
                        format!("{:?}", p.kind).to_lowercase(),
                        p.command.render(&Default::default()),
                        p.description,
                        p.origin
                    );
                }
            }
            Ok(0)
        }
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
            let spinner = crate::wizard::prompt::Spinner::new();
            use crate::wizard::Progress as _;
            spinner.step(&format!("running {} on {prompt:?}", p.name));
            let report = maker::smoke_test_with(&p, &prompt, events).await;
            spinner.done(&format!("{} answered in {} ms", p.name, report.duration_ms));
            print_report(&report, json)?;
            Ok(if report.ok { 0 } else { 1 })
        }
        ProfileAction::New {
            name,
            command,
            args,
            prompt_via,
            cwd,
            stream,
            timeout_secs,
            acp,
            permissions,
            description,
            env,
            test_prompt,
            no_test,
            resume_try_secs,
            force,
            json,
        } => {
            if !crate::config::valid_name(&name) {
                bail!("profile name {name:?}: use lower-case letters, digits, - and _");
            }
            let env = env
                .iter()
                .map(|pair| maker::env_pair(pair))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let command = match command {
                Some(c) => c,
                None => bail!("give the agent's program with --command (and its arguments with --arg, `{{{{prompt}}}}` for the task's text)"),
            };
            let stream = match stream.as_str() {
                "auto" => None,
                other => Some(
                    serde_json::from_value::<crate::runner::stream::StreamFormat>(serde_json::Value::String(other.into()))
                        .map_err(|_| anyhow::anyhow!("--stream {other:?}: use auto, none, ndjson, sse, claude, codex or gemini"))?,
                ),
            };
            let mut new = maker::NewProfile {
                description: description
                    .unwrap_or_else(|| format!("{command} (made with profile new)")),
                name: name.clone(),
                command,
                args,
                prompt_via,
                cwd,
                stream,
                timeout_secs,
                acp,
                permissions,
                env,
                resume_flag: None,
            };
            let spinner = crate::wizard::prompt::Spinner::new();
            use crate::wizard::Progress as _;
            let format = match (new.stream, new.acp || no_test) {
                (Some(f), _) => f,
                (None, true) => crate::runner::stream::StreamFormat::None,
                (None, false) => {
                    spinner.step(&format!("running {} once to see its output", new.command));
                    let f = maker::detect(&new, &test_prompt).await?;
                    spinner.done(&format!("its output is framed as: {}", f.as_str()));
                    f
                }
            };
            new.stream = Some(format);
            let mut text = maker::render(&new, format);
            let path = maker::target(&dirs, &name);
            maker::write_with_env(&path, &text, &new.env, force)?;
            for warning in Profile::parse(&text, &name, "the new profile")?.warnings() {
                errln!("warning: {warning}");
            }
            let report = if no_test {
                None
            } else {
                let p = Profile::find(&path.display().to_string(), &dirs)?;
                spinner.step("smoke test");
                let r = maker::smoke_test(&p, &test_prompt).await;
                spinner.done(&format!(
                    "smoke test: {}",
                    if r.ok { "ok" } else { "failed" }
                ));
                Some(r)
            };
            // Whether it can continue a conversation: a second turn told which session to
            // resume must know what the first was told.
            let resume = match &report {
                Some(r) if r.ok && !new.acp && !maker::resumes_already(&new) => {
                    spinner.clear();
                    let limit = std::time::Duration::from_secs(resume_try_secs.max(1));
                    let progress = |line: &str| errln!("{line}");
                    let check = maker::find_resume_flag(&new, format, limit, &progress);
                    // Ctrl-C drops the try, whose process group goes with it, instead of
                    // leaving the agent running after this command is gone.
                    let found = tokio::select! {
                        found = check => found,
                        _ = tokio::signal::ctrl_c() => {
                            errln!("interrupted; the try was stopped and {} written without a resume flag", path.display());
                            return Ok(130);
                        }
                    };
                    if let Some(flag) = &found.flag {
                        new.resume_flag = Some(flag.clone());
                        text = maker::render(&new, format);
                        maker::write_with_env(&path, &text, &new.env, true)?;
                    }
                    Some(found)
                }
                _ => None,
            };
            if json {
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
    }
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
