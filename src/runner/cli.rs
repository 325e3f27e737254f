//! A task on a command-line agent: the profile's command run once (no shell), the prompt on
//! stdin or in whole arguments, stdout read live through the profile's stream format, `HELP:`
//! lines asked of the dispatcher, stderr kept for errors, and the process group stopped at the
//! end.

use super::*;

/// What stdout gave: plain text, or a parsed stream.
pub(super) enum Stdout {
    Text(Vec<u8>, bool),
    Stream(Box<StreamParser>),
}

/// How the wait for the process ended.
pub(super) enum Ended {
    Exited(std::process::ExitStatus),
    /// The stream's final event came and the process did not exit within the linger time;
    /// it was stopped, and the run counts by its stream.
    Lingered,
}

/// Runs one task with a CLI profile. The prompt reaches the agent only through the profile's
/// templates, as whole arguments or stdin; there is no shell. Stream events (for stream
/// formats) go to `events` as they are read.
/// The profile's arguments for the run, with its `mcp_args` when the task has an MCP server.
fn args_with_mcp(
    profile: &Profile,
    task: &TaskInput,
    resuming: bool,
) -> Vec<super::template::Template> {
    let mut args = profile.args_for(resuming);
    if task.mcp.is_some() {
        args.extend(profile.mcp_args.iter().cloned());
    }
    args
}

#[tracing::instrument(skip_all, fields(profile = %profile.name, pid))]
pub async fn run_cli(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    let started = Instant::now();
    // The permission policy in the CLI's own terms, first (before any subcommand), unless
    // the profile passes that option itself.
    let resuming = task.resume_id.as_deref().is_some_and(|id| !id.is_empty());
    let stdin_piped = profile.stdin.is_some() || profile.help_lines;
    let Started {
        mut child, vars, ..
    } = start_for_task(
        profile,
        task,
        &args_with_mcp(profile, task, resuming),
        stdin_piped,
    )?;
    tracing::debug!("agent started");
    let (stdin, stdout, stderr) = child.pipes();
    let stdin_text = profile.stdin.as_ref().map(|t| t.render(&vars));
    // Feed stdin, drain stdout and stderr, and wait, all at once: doing them in turn can
    // deadlock on a full pipe.
    // With `help_lines`, stdin stays open after the prompt: each answer to a `HELP:` line goes
    // in as one line.
    let (answers_tx, answers_rx) = mpsc::channel::<String>(1);
    let asker = profile
        .help_lines
        .then(|| Asker::new(task.questions.clone(), answers_tx, profile.ask_timeout));
    let feeding = feed(stdin, stdin_text, profile.help_lines, answers_rx);
    let finished = Notify::new();
    // Once the agent has exited or been stopped, its pipes get GRACE to reach their end; a
    // process that escaped its group (`setsid cmd &`) may hold them open forever.
    let ended = Notify::new();
    let stop_reading = CancellationToken::new();
    let reads = async {
        let stdout = read_stdout(profile, stdout, events, &finished, &stop_reading, &asker);
        let stderr = read_tail(stderr, STDERR_TAIL, &stop_reading);
        let out = drain_until_stopped(
            async { tokio::join!(stdout, stderr) },
            &ended,
            &stop_reading,
        )
        .await;
        // No more questions: the answers channel closes, and with it the agent's stdin.
        if let Some(asker) = &asker {
            asker.close();
        }
        out
    };
    let waiting = async {
        let outcome = wait_for(&mut child, profile, &finished, cancel).await;
        ended.notify_one();
        outcome
    };
    let ((), (out, err), ended) = tokio::join!(feeding, reads, waiting);
    if let Some(asker) = &asker {
        asker.check_answered(&ended)?;
    }
    let ended = ended?;
    let stdout = out?;
    let stderr_text = clean(&String::from_utf8_lossy(&err?), true, true);
    judge(profile, &ended, stdout, stderr_text, started)
}

/// Writes the prompt (when the profile gives one on stdin) and then, with `help_lines`, each
/// answer as one line, until the answers end; then closes stdin.
async fn feed(
    pipe: Option<tokio::process::ChildStdin>,
    text: Option<String>,
    help_lines: bool,
    mut answers: mpsc::Receiver<String>,
) {
    let Some(mut pipe) = pipe else { return };
    if let Err(e) = write_input(&mut pipe, text, help_lines, &mut answers).await {
        // An agent that exits without reading all of its input is not an error here: the
        // closed pipe ends the feeding, and the exit status says how the run went.
        tracing::debug!(error = %e, "the agent's stdin closed before all input was written");
    }
    let _ = pipe.shutdown().await;
}

async fn write_input(
    pipe: &mut tokio::process::ChildStdin,
    text: Option<String>,
    help_lines: bool,
    answers: &mut mpsc::Receiver<String>,
) -> std::io::Result<()> {
    if let Some(text) = text {
        pipe.write_all(text.as_bytes()).await?;
        if help_lines && !text.ends_with('\n') {
            pipe.write_all(b"\n").await?;
        }
    }
    if help_lines {
        while let Some(line) = answers.recv().await {
            pipe.write_all(format!("{line}\n").as_bytes()).await?;
            pipe.flush().await?;
        }
    }
    Ok(())
}

/// Reads stdout to its end: as text shown line by line without a stream format, else through
/// the profile's stream parser (which signals `finished` at the stream's final event).
async fn read_stdout(
    profile: &Profile,
    stdout: impl AsyncRead + Unpin,
    events: &mpsc::Sender<StreamEvent>,
    finished: &Notify,
    stop: &CancellationToken,
    asker: &Option<Asker>,
) -> std::io::Result<Stdout> {
    let max = profile.output.max_bytes;
    if profile.stream == StreamFormat::None {
        let mut shown = Shown {
            events,
            budget: max,
            strip_ansi: profile.output.strip_ansi,
            pending: Vec::new(),
        };
        let (bytes, truncated) = read_capped(stdout, max, stop, asker.as_ref(), &mut shown).await?;
        return Ok(Stdout::Text(bytes, truncated));
    }
    let parser = StreamParser::with_limit(profile.stream, max);
    let parser = read_stream(stdout, parser, events, finished, stop, asker.as_ref()).await?;
    Ok(Stdout::Stream(Box::new(parser)))
}

/// Waits for the agent to exit, or stops its group: after the stream's final event and the
/// profile's linger time, at the timeout, or when the task is cancelled.
async fn wait_for(
    child: &mut GroupChild,
    profile: &Profile,
    finished: &Notify,
    cancel: &CancellationToken,
) -> Result<Ended, RunError> {
    let lingered = async {
        finished.notified().await;
        tokio::time::sleep(profile.linger).await;
    };
    let outcome = tokio::select! {
        status = child.child.wait() => status.map(Ended::Exited).map_err(RunError::from),
        _ = lingered => Ok(Ended::Lingered),
        _ = tokio::time::sleep(profile.timeout) => Err(RunError::TimedOut(profile.timeout)),
        _ = cancel.cancelled() => Err(RunError::Cancelled),
    };
    match outcome {
        Ok(Ended::Exited(status)) => {
            child.reap_group(GRACE).await;
            Ok(Ended::Exited(status))
        }
        Ok(Ended::Lingered) => {
            tracing::info!("the agent finished its answer but did not exit; stopping it");
            child.terminate(GRACE).await?;
            Ok(Ended::Lingered)
        }
        Err(e) => {
            child.terminate(GRACE).await?;
            Err(e)
        }
    }
}

/// The run's answer from how the agent ended and what it wrote, or why it failed.
fn judge(
    profile: &Profile,
    ended: &Ended,
    stdout: Stdout,
    stderr_text: String,
    started: Instant,
) -> Result<RunOutput, RunError> {
    let opts = &profile.output;
    let failed = |status| RunError::Failed {
        status,
        stderr: stderr_text.clone(),
    };
    let exit_failure = exit_failure(profile, ended);
    let (mut output, truncated, session_id) = match stdout {
        Stdout::Text(bytes, truncated) => {
            if let Some(status) = exit_failure {
                return Err(limit::or_failure(&stderr_text, None, failed(status)));
            }
            let text = clean(&String::from_utf8_lossy(&bytes), opts.strip_ansi, opts.trim);
            (text, truncated, None)
        }
        Stdout::Stream(parser) => {
            // The stream's own error says most; then the exit status with stderr.
            if let Some(error) = parser.end.error {
                let stated = parser.end.usage_limit;
                return Err(limit::or_failure(
                    &error,
                    stated,
                    RunError::Reported(error.clone()),
                ));
            }
            if let Some(status) = exit_failure {
                return Err(limit::or_failure(&stderr_text, None, failed(status)));
            }
            let (text, truncated) = stream_answer(&parser, opts);
            (text, truncated, parser.session_id)
        }
    };
    if opts.include_stderr && !stderr_text.is_empty() {
        if !output.is_empty() {
            output.push('\n');
        }
        output.push_str(&stderr_text);
    }
    Ok(RunOutput {
        output,
        truncated,
        duration: started.elapsed(),
        session_id,
        files: Vec::new(),
        context_lost: false,
        no_resume: false,
    })
}

/// How the agent's exit failed, in words, when its status is not one the profile counts as
/// success (a lingering agent stopped after its answer did not fail).
fn exit_failure(profile: &Profile, ended: &Ended) -> Option<String> {
    let Ended::Exited(status) = ended else {
        return None;
    };
    if status
        .code()
        .is_some_and(|c| profile.success_exit_codes.contains(&c))
    {
        return None;
    }
    Some(match status.code() {
        Some(c) => format!("exited with status {c}"),
        None => {
            use std::os::unix::process::ExitStatusExt;
            format!("was killed by signal {}", status.signal().unwrap_or(0))
        }
    })
}

/// The stream's final text, cleaned, with what was refused during the task said after it,
/// capped at the profile's output limit.
fn stream_answer(parser: &StreamParser, opts: &profile::OutputOptions) -> (String, bool) {
    let mut text = clean(
        parser.end.final_text.as_deref().unwrap_or_default(),
        opts.strip_ansi,
        opts.trim,
    );
    if !parser.end.refused.is_empty() {
        text = format!(
            "{}\n\n(aamp-bridge: refused during this task: {})",
            text.trim_end(),
            parser.end.refused.join("; ")
        );
    }
    let (text, truncated) = cap(text, opts.max_bytes);
    (text, truncated || parser.text_cut)
}

/// Longest stream line accepted; a longer one is skipped whole.
pub(super) const MAX_LINE: usize = 8 << 20;

/// Relays `HELP:` lines of a CLI agent to the dispatcher and their answers back to its stdin.
pub(super) struct Asker {
    questions: Option<mpsc::Sender<Question>>,
    /// To the agent's stdin; taken (closing stdin) once its output has ended.
    answers: std::sync::Mutex<Option<mpsc::Sender<String>>>,
    wait: Duration,
    /// Set when a question went unanswered for this many seconds.
    unanswered: std::sync::Mutex<Option<u64>>,
}

impl Asker {
    fn new(
        questions: Option<mpsc::Sender<Question>>,
        answers: mpsc::Sender<String>,
        wait: Duration,
    ) -> Asker {
        Asker {
            questions,
            answers: std::sync::Mutex::new(Some(answers)),
            wait,
            unanswered: std::sync::Mutex::new(None),
        }
    }

    /// A question that went unanswered refuses the run, unless the run ended for a reason of
    /// its own (cancelled, timed out), which then says more.
    fn check_answered(&self, ended: &Result<Ended, RunError>) -> Result<(), RunError> {
        let unanswered = *self.unanswered.lock().expect("unanswered lock");
        match unanswered {
            Some(secs) if !matches!(ended, Err(RunError::Cancelled) | Err(RunError::TimedOut(_))) => {
                Err(RunError::Stopped(format!(
                    "the agent's question got no answer within {secs}s (ask_timeout_secs), so it was refused"
                )))
            }
            _ => Ok(()),
        }
    }

    /// `HELP: question | option | option`: asks, waits, and writes the answer (the option's
    /// name, or the free text on one line; an empty line when none came) to the agent.
    async fn ask(&self, line: &str) {
        let body = line.trim_start_matches("HELP:").trim();
        let mut parts = body.split('|').map(str::trim);
        let text = parts.next().unwrap_or_default().to_string();
        let options: Vec<String> = parts
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let reply = match &self.questions {
            Some(questions) => {
                let (answer, chosen) = tokio::sync::oneshot::channel();
                let question = Question {
                    text,
                    reason: "The agent asks for a decision.".into(),
                    options: options.clone(),
                    answer,
                };
                if questions.send(question).await.is_err() {
                    String::new()
                } else {
                    match tokio::time::timeout(self.wait, chosen).await {
                        Ok(Ok(Answer::Chosen(i))) => options.get(i).cloned().unwrap_or_default(),
                        Ok(Ok(Answer::Text(words))) => {
                            words.split_whitespace().collect::<Vec<_>>().join(" ")
                        }
                        Ok(_) => String::new(),
                        Err(_) => {
                            tracing::warn!(
                                seconds = self.wait.as_secs(),
                                "no answer to the agent's question in time"
                            );
                            *self.unanswered.lock().expect("unanswered lock") =
                                Some(self.wait.as_secs());
                            String::new()
                        }
                    }
                }
            }
            None => String::new(),
        };
        let answers = self.answers.lock().expect("answers lock").clone();
        if let Some(answers) = answers {
            let _ = answers.send(reply).await;
        }
    }

    fn close(&self) {
        self.answers.lock().expect("answers lock").take();
    }
}

/// Reads a line-framed stream into `parser`, sending its events as they come, and signals
/// `finished` once the stream's final event has been read.
pub(super) async fn read_stream(
    mut pipe: impl AsyncRead + Unpin,
    mut parser: StreamParser,
    events: &mpsc::Sender<StreamEvent>,
    finished: &Notify,
    stop: &CancellationToken,
    asker: Option<&Asker>,
) -> std::io::Result<StreamParser> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut line = Gathered::default();
    let mut signalled = false;
    let mut drained = 0;
    loop {
        let n = read_or_stop(&mut pipe, &mut buf, stop, &mut drained).await?;
        if n == 0 {
            break;
        }
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            let Some(data) = chunk.strip_suffix(b"\n") else {
                line.add(chunk);
                continue;
            };
            line.add(data);
            match (line.whole(), asker) {
                (Some(whole), Some(asker)) if whole.starts_with(b"HELP:") => {
                    asker.ask(&String::from_utf8_lossy(whole)).await;
                }
                (Some(whole), _) => {
                    send_all(events, parser.line(&String::from_utf8_lossy(whole))).await;
                    if parser.end.finished && !signalled {
                        signalled = true;
                        finished.notify_one();
                    }
                }
                (None, _) => {}
            }
            line.clear();
        }
    }
    if let Some(whole) = line.whole().filter(|l| !l.is_empty()) {
        send_all(events, parser.line(&String::from_utf8_lossy(whole))).await;
    }
    send_all(events, parser.finish()).await;
    Ok(parser)
}

/// A stream line being read: skipped whole once it is longer than [`MAX_LINE`].
#[derive(Default)]
struct Gathered {
    line: Vec<u8>,
    skipping: bool,
}

impl Gathered {
    fn add(&mut self, data: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + data.len() > MAX_LINE {
            tracing::warn!(
                limit = MAX_LINE,
                "a stream line from the agent is too long; skipping it"
            );
            self.skipping = true;
            self.line.clear();
        } else {
            self.line.extend_from_slice(data);
        }
    }

    /// The line so far, unless it is being skipped.
    fn whole(&self) -> Option<&[u8]> {
        (!self.skipping).then_some(self.line.as_slice())
    }

    /// For the next line.
    fn clear(&mut self) {
        self.line.clear();
        self.skipping = false;
    }
}

/// Sends each event on; a closed channel (nobody watching any more) is not the run's concern.
async fn send_all(events: &mpsc::Sender<StreamEvent>, sent: Vec<StreamEvent>) {
    for event in sent {
        let _ = events.send(event).await;
    }
}

/// Plain output (a profile without a stream format) shown as it comes: one
/// [`StreamEvent::Output`] (a `text.delta` on the live view) per
/// read of the pipe, holding its whole lines, and [`SHOWN_PART`] at a time of a line that goes
/// on without its end (progress output), up to `budget` bytes in all (what the answer keeps at
/// most).
pub(super) struct Shown<'a> {
    pub events: &'a mpsc::Sender<StreamEvent>,
    pub budget: usize,
    pub strip_ansi: bool,
    pub pending: Vec<u8>,
}

/// How much of a line without its end yet is shown at once.
const SHOWN_PART: usize = 4096;

impl Shown<'_> {
    fn add(&mut self, bytes: &[u8]) {
        let bytes = &bytes[..bytes.len().min(self.budget)];
        self.budget -= bytes.len();
        self.pending.extend_from_slice(bytes);
    }

    /// Adds `line[*from..]` up to its last whole UTF-8 character, when that is at least
    /// [`SHOWN_PART`] long, and moves `from` on.
    fn add_part(&mut self, line: &[u8], from: &mut usize) {
        let rest = &line[*from..];
        if rest.len() < SHOWN_PART {
            return;
        }
        let whole = match std::str::from_utf8(rest) {
            Ok(_) => rest.len(),
            // An incomplete character at the end waits for its other bytes.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => rest.len(),
        };
        self.add(&rest[..whole]);
        *from += whole;
    }

    async fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let text = clean(
            &String::from_utf8_lossy(&std::mem::take(&mut self.pending)),
            self.strip_ansi,
            false,
        );
        let _ = self.events.send(StreamEvent::Output(text)).await;
    }
}

/// Reads everything, keeping the first `max` bytes, and shows its lines as they come.
pub(super) async fn read_capped(
    mut pipe: impl AsyncRead + Unpin,
    max: usize,
    stop: &CancellationToken,
    asker: Option<&Asker>,
    shown: &mut Shown<'_>,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 16 * 1024];
    // Text is looked at line by line, so lines are shown whole and `HELP:` lines (with an
    // asker) can be taken out; `from` is how much of the line was shown already.
    let mut line: Vec<u8> = Vec::new();
    let mut from = 0;
    let mut keep = |bytes: &[u8], kept: &mut Vec<u8>| {
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        truncated |= bytes.len() > room;
    };
    let mut drained = 0;
    loop {
        let n = read_or_stop(&mut pipe, &mut buf, stop, &mut drained).await?;
        if n == 0 {
            if asker.is_some() {
                keep(&line, &mut kept);
            }
            shown.add(&line[from.min(line.len())..]);
            shown.flush().await;
            return Ok((kept, truncated));
        }
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            if asker.is_none() {
                keep(chunk, &mut kept);
            }
            if line.len() < MAX_LINE {
                line.extend_from_slice(chunk);
            }
            let asked = asker.filter(|_| line.starts_with(b"HELP:"));
            if chunk.last() == Some(&b'\n') {
                match asked {
                    Some(asker) => {
                        // What came before the question is shown before it.
                        shown.flush().await;
                        asker.ask(String::from_utf8_lossy(&line).trim_end()).await;
                    }
                    None => {
                        if asker.is_some() {
                            keep(&line, &mut kept);
                        }
                        shown.add(&line[from.min(line.len())..]);
                    }
                }
                line.clear();
                from = 0;
            } else if asked.is_none() {
                // A `HELP:` line is never shown; a part is over 5 bytes, so `asked` knows.
                shown.add_part(&line, &mut from);
            }
        }
        shown.flush().await;
    }
}
