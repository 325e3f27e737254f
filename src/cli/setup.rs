//! `aamp-bridge init`, `import` and `inspect`: making a config, carrying over the reference
//! bridges' files, and reading one mail as AAMP.

use crate::output::{errln, out, outln};

use super::*;

pub(super) async fn init(
    config_path: &std::path::Path,
    non_interactive: bool,
    answers: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::wizard::{self, prompt};
    let answers = match (non_interactive, answers) {
        (true, Some(file)) => {
            let text = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read the answers file {}", file.display()))?
            };
            wizard::Answers::parse(&text)?
        }
        (false, Some(_)) => bail!("--answers goes with --non-interactive"),
        _ => match prompt::ask(config_path).await {
            Ok(Some(a)) => a,
            Ok(None) => {
                outln!("Nothing was written.");
                return Ok(1);
            }
            Err(e) if e.is::<prompt::Cancelled>() => {
                outln!("{e}");
                return Ok(130);
            }
            Err(e) => return Err(e),
        },
    };
    let spinner = prompt::Spinner::new();
    let applied = match wizard::apply(&answers, config_path, &spinner).await {
        Ok(applied) => applied,
        // The answers given in the terminal are not lost with the failure: they are kept in
        // a file (0600: it may hold a password) that `init --answers` takes as it is.
        Err(e) if !non_interactive => {
            spinner.clear();
            let dir = config_path.parent().unwrap_or(std::path::Path::new("."));
            let kept = dir.join("init-answers.json");
            let text = serde_json::to_string_pretty(&answers)?;
            errln!("aamp-bridge: {e:#}");
            match crate::fsio::write_atomic(&kept, text.as_bytes(), 0o600) {
                Ok(()) => errln!(
                    "Nothing was written, but your answers are kept in {} (mode 0600). Once the cause is fixed, go on from them:\n  aamp-bridge --config {} init --non-interactive --answers {}\n(and delete the file afterwards)",
                    kept.display(),
                    config_path.display(),
                    kept.display()
                ),
                Err(w) => errln!("Nothing was written (and your answers could not be kept in {}: {w})", kept.display()),
            }
            return Ok(1);
        }
        Err(e) => return Err(e),
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&applied)?);
        return Ok(0);
    }
    wizard::print_applied(&applied);
    if !non_interactive {
        if let Some(done) = prompt::offer_service(config_path)? {
            outln!("service: {done}");
        }
        outln!(
            "Check everything with `aamp-bridge doctor`; see each task with `aamp-bridge tasks`."
        );
    }
    Ok(0)
}

pub(super) fn import(
    config_path: &std::path::Path,
    from: Option<PathBuf>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::wizard::{self, import};
    let from = from.unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".aamp")
    });
    let existing = wizard::existing(config_path)?.map(|c| c.config);
    let plan = import::plan(&from, config_path, existing)?;
    let text = crate::config::render(plan.config.as_ref().expect("a plan has a config"));
    if !dry_run {
        import::write(&plan, config_path)?;
    }
    if json {
        let files: Vec<serde_json::Value> = plan
            .files
            .iter()
            .map(|(p, _, mode)| serde_json::json!({"path": p, "mode": format!("{mode:o}")}))
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "config": config_path, "written": !dry_run, "sources": plan.sources,
                "files": files, "pairCodes": plan.pair_codes.iter().map(|(a, _, _)| a).collect::<Vec<_>>(),
                "notes": plan.notes, "text": text,
            })
        );
        return Ok(0);
    }
    for source in &plan.sources {
        outln!("read {}", source.display());
    }
    if dry_run {
        outln!("\nwould write {}:\n", config_path.display());
        out!("{text}");
        for (path, bytes, mode) in &plan.files {
            outln!(
                "\nwould write {} (mode {mode:o}, {} bytes)",
                path.display(),
                bytes.len()
            );
        }
    } else {
        outln!("wrote {}", config_path.display());
        for (path, _, mode) in &plan.files {
            outln!("wrote {} (mode {mode:o})", path.display());
        }
    }
    for (agent, _, left) in &plan.pair_codes {
        outln!(
            "pairing code of {agent} carried over (valid {} more minutes)",
            left.as_secs() / 60
        );
    }
    for note in &plan.notes {
        outln!("note: {note}");
    }
    if !dry_run {
        outln!("next: `aamp-bridge doctor`, then `aamp-bridge start`; stop the old bridges first, or both answer the same mail");
    }
    Ok(0)
}

pub(super) fn inspect(file: &PathBuf, json: bool) -> anyhow::Result<i32> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let view = protocol::parse_raw(&bytes)
        .with_context(|| format!("{} is not a mail (no header found)", file.display()))?;
    match AampMessage::parse(&view) {
        Ok(msg) if json => outln!("{}", serde_json::to_string_pretty(&msg.to_json())?),
        Ok(msg) => {
            outln!(
                "{} {} from {}",
                msg.intent(),
                msg.task_id(),
                msg.envelope.from
            );
            for (k, v) in msg.to_json().as_object().into_iter().flatten() {
                outln!("  {k}: {v}");
            }
        }
        Err(reason) => {
            outln!("not AAMP: {reason}");
            return Ok(1);
        }
    }
    Ok(0)
}
