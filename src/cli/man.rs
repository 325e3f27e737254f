//! `aamp-bridge man`: the manual pages. clap_mangen renders what `--help` says (name,
//! synopsis, options, subcommands); a man page also says where the files are, what the
//! environment changes, how it exits and how it is used, so those sections follow on every
//! page (the examples on the pages they are about).

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

const FILES: &str = r#".SH FILES
.TP
\fI$XDG_CONFIG_HOME/aamp\-bridge/config.toml\fR (default \fI~/.config/aamp\-bridge/config.toml\fR)
The config (\fB\-\-config\fR names another). \fBaamp\-bridge init\fR writes it.
.TP
The files a mailbox's \fBpassword_file\fR, \fBtoken_file\fR, \fBapi_key_file\fR or \fBkey_file\fR name
The mailboxes' secrets, beside the config (\fBinit\fR writes them there), mode 0600, never in the config.
.TP
\fI~/.config/aamp\-bridge/profiles/\fR
Agent profiles of your own (\fBaamp\-bridge profile new\fR); they override the built\-in ones
of the same name (\fI/usr/share/aamp\-bridge/profiles\fR holds copies as examples).
.TP
\fI$XDG_STATE_HOME/aamp\-bridge/\fR (default \fI~/.local/state/aamp\-bridge/\fR)
The state directory (\fBstate_dir\fR): the journal of every task, each conversation's
workspace and the mailboxes' cursors.
.TP
\fI~/.config/systemd/user/aamp\-bridge.service\fR, \fI/usr/lib/systemd/user/aamp\-bridge.service\fR
The systemd user unit: your own (\fBaamp\-bridge service install\fR) or the package's.
"#;

const ENVIRONMENT: &str = r#".SH ENVIRONMENT
.TP
\fBXDG_CONFIG_HOME\fR, \fBXDG_STATE_HOME\fR, \fBHOME\fR
Where the config and the state directory are (see FILES).
.TP
\fBAAMP_BRIDGE_LOG\fR (or \fBRUST_LOG\fR)
What the log on stderr shows, as a filter: \fIinfo\fR (the default), \fIdebug\fR,
\fIaamp_bridge=debug\fR.
.TP
\fBPATH\fR
Where agents' commands are found; the service keeps the PATH of the shell that installed it.
.PP
Agents get the bridge's environment with their profile's \fBenv\fR and \fBenv_file\fR over it:
their API keys (\fBANTHROPIC_API_KEY\fR, \fBCODEX_API_KEY\fR, \fBGEMINI_API_KEY\fR, ...) are
read from there, and \fBaamp\-bridge agents\fR says whether each is logged in.
"#;

const EXIT_STATUS: &str = r#".SH EXIT STATUS
.TP
\fB0\fR
Success (for \fBdispatch\fR: the task's result is \fIcompleted\fR).
.TP
\fB1\fR
A failure, said on stderr with its fix: a config that does not load, a check that failed
(\fBdoctor\fR, \fBservice status\fR, a smoke test), a result that is not \fIcompleted\fR.
.TP
\fB2\fR
A command line that cannot be used (unknown option, missing argument; \fBdispatch \-\-follow\fR
from a mailbox with no AAMP service).
.TP
\fB3\fR
\fBdispatch\fR: the mail server reported the task undeliverable.
.TP
\fB130\fR
Interrupted (Ctrl\-C) where the command stops what it started.
"#;

/// Examples for the pages they are about (the top page gets the walk from nothing).
fn examples(name: &str) -> &'static str {
    match name {
        "aamp-bridge" => {
            r#".SH EXAMPLES
.nf
aamp\-bridge init                      # ask, test each mailbox, write the config
aamp\-bridge agents                    # which agents are installed and logged in
aamp\-bridge start                     # watch the mailboxes and run tasks (Ctrl\-C stops)
aamp\-bridge dispatch \-\-from me \-\-to helper@example.com "hello"
aamp\-bridge service install           # run it in the background (systemd or launchd)
aamp\-bridge doctor                    # what is wrong, with the fix
.fi
"#
        }
        "aamp-bridge-dispatch" => {
            r#".SH EXAMPLES
.nf
aamp\-bridge dispatch \-\-from me \-\-to helper@example.com "list the files"
echo "review this" | aamp\-bridge dispatch \-\-from me \-\-to helper@example.com \-
aamp\-bridge dispatch \-\-from me \-\-to helper@example.com \-\-follow \-\-session\-key review "go on"
.fi
"#
        }
        "aamp-bridge-init" => {
            r#".SH EXAMPLES
.nf
aamp\-bridge init
aamp\-bridge init \-\-non\-interactive \-\-answers answers.json
.fi
"#
        }
        "aamp-bridge-profile-new" => {
            r#".SH EXAMPLES
.nf
aamp\-bridge profile new mytool \-\-command mytool \-\-arg=\-p \-\-arg='{{prompt}}'
aamp\-bridge profile new qwen \-\-command qwen \-\-env OPENAI_API_KEY=... \-\-resume\-try\-secs 30
.fi
"#
        }
        _ => "",
    }
}

/// One command's page: clap's sections, then ours.
fn page(cmd: &clap::Command) -> anyhow::Result<(String, Vec<u8>)> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render(&mut out).context("rendering a manual page")?;
    out.extend_from_slice(examples(cmd.get_name()).as_bytes());
    for section in [FILES, ENVIRONMENT, EXIT_STATUS] {
        out.extend_from_slice(section.as_bytes());
    }
    Ok((man.get_filename(), out))
}

/// Every page, as clap_mangen names them (`aamp-bridge-start.1`, ...).
fn pages(cmd: &clap::Command, all: &mut Vec<(String, Vec<u8>)>) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, all)?;
    }
    all.push(page(cmd)?);
    Ok(())
}

/// The top page on stdout, or every page into `dir`.
pub(super) fn man(cmd: clap::Command, dir: Option<&Path>) -> anyhow::Result<i32> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    match dir {
        None => {
            let (_, text) = page(&cmd)?;
            std::io::stdout()
                .write_all(&text)
                .context("writing the manual page")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let mut all = Vec::new();
            pages(&cmd, &mut all)?;
            for (name, text) in all {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    /// Issue 43: the pages were the `--help` text only.
    #[test]
    fn every_page_has_files_environment_and_exit_status() {
        use clap::CommandFactory as _;
        let mut cmd = super::super::Cli::command().disable_help_subcommand(true);
        cmd.build();
        let mut all = Vec::new();
        super::pages(&cmd, &mut all).unwrap();
        assert!(all.len() > 10);
        for (name, text) in &all {
            let text = String::from_utf8_lossy(text);
            for section in [".SH FILES", ".SH ENVIRONMENT", ".SH EXIT STATUS"] {
                assert!(text.contains(section), "{name}: {section}");
            }
        }
        let top = all.iter().find(|(n, _)| n == "aamp-bridge.1").unwrap();
        assert!(String::from_utf8_lossy(&top.1).contains(".SH EXAMPLES"));
    }
}
