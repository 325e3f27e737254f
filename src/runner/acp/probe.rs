//! A cheap check that an installed agent speaks ACP, how it authenticates, and whether it is logged
//! in.

use super::*;

/// What an agent says about itself in `initialize`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProbeInfo {
    /// `name version` from `agentInfo`, when given.
    pub agent: Option<String>,
    pub auth_methods: Vec<String>,
    pub load_session: bool,
    pub resume_session: bool,
    /// With `open_session`: the session the agent opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// Starts the agent, sends `initialize` (and with `open_session` also opens a session,
/// authenticating the way a task would), and stops it: a cheap check that an installed agent
/// really speaks ACP, how it authenticates, and whether it is logged in.
pub async fn probe(
    profile: &Profile,
    cwd: &Path,
    open_session_too: bool,
) -> Result<ProbeInfo, RunError> {
    let vars = crate::runner::template::Vars::default();
    let program = profile.command.render(&vars);
    let mut child = spawn_agent(profile, None, &program, &profile.args, &vars, cwd, true)?;
    let (stdin, stdout, stderr) = child.pipes();
    let stdin = stdin.expect("stdin is piped");
    let info: Mutex<Option<ProbeInfo>> = Mutex::new(None);
    let refused: Mutex<Option<RunError>> = Mutex::new(None);
    let done = Notify::new();
    let connection = Client.v1().name("aamp-bridge").connect_with(
        Lines::new(line_sink(stdin), line_stream(stdout)),
        async |cx: ConnectionTo<Agent>| {
            // Done (and the agent stopped soon after) only once the session is open too: an
            // agent still authenticating was stopped mid-way ("Incoming transport closed").
            let outcome = async {
                let request = initialize_request(profile.permissions, false);
                let reply = tokio::time::timeout(
                    profile.init_timeout,
                    cx.send_request(request).block_task(),
                )
                .await;
                let Ok(reply) = reply else { return Ok(()) };
                let init = reply?;
                let mut found = ProbeInfo::of(&init);
                if open_session_too {
                    let shared = Shared::default();
                    match open_session(&cx, profile, &init, cwd, (None, None), &shared).await? {
                        Ok(id) => found.session_id = Some(id),
                        Err(why) => {
                            *refused.lock().expect("probe lock") = Some(not_opened(why, profile));
                            return Ok(());
                        }
                    }
                }
                *info.lock().expect("probe lock") = Some(found);
                Ok(())
            }
            .await;
            done.notify_one();
            outcome
        },
    );
    let (connection, status, stderr_text) = settle(&mut child, stderr, connection, &done).await;
    if let Some(why) = refused.into_inner().expect("probe lock") {
        return Err(why);
    }
    match info.into_inner().expect("probe lock") {
        Some(info) => Ok(info),
        None => Err(no_answer(profile, connection, status, stderr_text)),
    }
}

impl ProbeInfo {
    fn of(init: &InitializeResponse) -> ProbeInfo {
        ProbeInfo {
            agent: init
                .agent_info
                .as_ref()
                .map(|i| format!("{} {}", i.name, i.version)),
            auth_methods: init.auth_methods.iter().map(auth_method_id).collect(),
            load_session: init.agent_capabilities.load_session,
            resume_session: init
                .agent_capabilities
                .session_capabilities
                .resume
                .is_some(),
            session_id: None,
        }
    }
}

/// Why the agent opened no session, as the task would say it.
fn not_opened(why: Driven, profile: &Profile) -> RunError {
    match why {
        Driven::NotLoggedIn(d) => not_logged_in(&d),
        Driven::SessionRefused(d) => session_refused(&d, profile),
        _ => RunError::Stopped("the agent did not open a session in time".into()),
    }
}

/// The agent gave no answer to `initialize`: the connection's error or the wait, with its exit
/// status and stderr.
fn no_answer(
    profile: &Profile,
    connection: Result<(), agent_client_protocol::Error>,
    status: Option<std::process::ExitStatus>,
    stderr: String,
) -> RunError {
    let what = match connection {
        Err(e) => format!("did not answer initialize ({})", e.message),
        Ok(()) => format!(
            "did not answer initialize within {}s",
            profile.init_timeout.as_secs()
        ),
    };
    let status = match status.and_then(|s| s.code()) {
        Some(code) => format!("{what} (exit status {code})"),
        None => what,
    };
    RunError::Failed { status, stderr }
}
