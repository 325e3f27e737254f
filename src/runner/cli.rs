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
#[tracing::instrument(skip_all, fields(profile = %profile.name, pid))]
pub async fn run_cli(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    let started = Instant::now();
    let vars = vars_for(task);
    let program = profile.command.render(&vars);
    // The permission policy in the CLI's own terms, first (before any subcommand), unless
    // the profile passes that option itself.
    let resuming = task.resume_id.as_deref().is_some_and(|id| !id.is_empty());
    let args = profile.args_for(resuming);
    let args = &args;
    let cwd = agent_cwd(profile, task, &vars);
    let stdin_piped = profile.stdin.is_some() || profile.help_lines;
    let mut child = spawn_agent(
        profile,
        Some(task),
        &program,
        args,
        &vars,
        &cwd,
        stdin_piped,
    )?;
    tracing::Span::current().record("pid", child.pid());
    task.spawned(child.pid());
    tracing::debug!("agent started");

    let stdin_text = profile.stdin.as_ref().map(|t| t.render(&vars));
    let stdin = child.child.stdin.take();
    let stdout = child.child.stdout.take().expect("stdout is piped");
    let stderr = child.child.stderr.take().expect("stderr is piped");

    // Feed stdin, drain stdout and stderr, and wait, all at once: doing them in turn can
    // deadlock on a full pipe.
    // With `help_lines`, stdin stays open after the prompt: each answer to a `HELP:` line goes
    // in as one line.
    let (answers_tx, mut answers_rx) = mpsc::channel::<String>(1);
    let asker = profile.help_lines.then(|| Asker {
        questions: task.questions.clone(),
        answers: std::sync::Mutex::new(Some(answers_tx)),
        wait: profile.ask_timeout,
        unanswered: std::sync::Mutex::new(None),
    });
    let help_lines = profile.help_lines;
    let feed = async move {
        let Some(mut pipe) = stdin else { return };
        // An agent that exits without reading all of its input is not an error here.
        if let Some(text) = stdin_text {
            let _ = pipe.write_all(text.as_bytes()).await;
            if help_lines && !text.ends_with('\n') {
                let _ = pipe.write_all(b"\n").await;
            }
        }
        if help_lines {
            while let Some(line) = answers_rx.recv().await {
                let _ = pipe.write_all(format!("{line}\n").as_bytes()).await;
                let _ = pipe.flush().await;
            }
        }
        let _ = pipe.shutdown().await;
    };
    let finished = Notify::new();
    // Once the agent has exited or been stopped, its pipes get GRACE to reach their end; a
    // process that escaped its group (`setsid cmd &`) may hold them open forever.
    let ended = Notify::new();
    let stop_reading = CancellationToken::new();
    let read_stdout = async {
        if profile.stream == StreamFormat::None {
            // Without a stream format the output's lines are shown as they come, as text.
            let mut shown = Shown {
                events,
                budget: profile.output.max_bytes,
                strip_ansi: profile.output.strip_ansi,
                pending: Vec::new(),
            };
            let (bytes, truncated) = read_capped(
                stdout,
                profile.output.max_bytes,
                &stop_reading,
                asker.as_ref(),
                &mut shown,
            )
            .await?;
            Ok::<_, std::io::Error>(Stdout::Text(bytes, truncated))
        } else {
            let parser = read_stream(
                stdout,
                StreamParser::with_limit(profile.stream, profile.output.max_bytes),
                events,
                &finished,
                &stop_reading,
                asker.as_ref(),
            )
            .await?;
            Ok(Stdout::Stream(Box::new(parser)))
        }
    };
    let reads = drain_until_stopped(
        async { tokio::join!(read_stdout, read_tail(stderr, STDERR_TAIL, &stop_reading)) },
        &ended,
        &stop_reading,
    );
    let waiting = async {
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
        let outcome = match outcome {
            Ok(Ended::Exited(status)) => {
                child.reap_group(GRACE).await;
                Ok(Ended::Exited(status))
            }
            Ok(Ended::Lingered) => {
                tracing::info!("the agent finished its answer but did not exit; stopping it");
                child
                    .terminate(GRACE)
                    .await
                    .map(|_| Ended::Lingered)
                    .map_err(RunError::from)
            }
            Err(e) => match child.terminate(GRACE).await {
                Ok(_) => Err(e),
                Err(io) => Err(io.into()),
            },
        };
        ended.notify_one();
        outcome
    };
    let reads = async {
        let out = reads.await;
        // No more questions: the answers channel closes, and with it the agent's stdin.
        if let Some(asker) = &asker {
            asker.close();
        }
        out
    };
    let ((), (out, err), ended) = tokio::join!(feed, reads, waiting);
    if let Some(secs) = asker
        .as_ref()
        .and_then(|a| *a.unanswered.lock().expect("unanswered lock"))
    {
        if !matches!(ended, Err(RunError::Cancelled) | Err(RunError::TimedOut(_))) {
            return Err(RunError::Stopped(format!(
                "the agent's question got no answer within {secs}s (ask_timeout_secs), so it was refused"
            )));
        }
    }
    let ended = ended?;
    let stdout = out?;
    let stderr_text = clean(&String::from_utf8_lossy(&err?), true, true);
    let exit_failure = match &ended {
        Ended::Exited(status)
            if !status
                .code()
                .is_some_and(|c| profile.success_exit_codes.contains(&c)) =>
        {
            Some(match status.code() {
                Some(c) => format!("exited with status {c}"),
                None => {
                    use std::os::unix::process::ExitStatusExt;
                    format!("was killed by signal {}", status.signal().unwrap_or(0))
                }
            })
        }
        _ => None,
    };
    let opts = &profile.output;
    let (mut output, truncated, session_id) = match stdout {
        Stdout::Text(bytes, truncated) => {
            if let Some(status) = exit_failure {
                return Err(RunError::Failed {
                    status,
                    stderr: stderr_text,
                });
            }
            (
                clean(&String::from_utf8_lossy(&bytes), opts.strip_ansi, opts.trim),
                truncated,
                None,
            )
        }
        Stdout::Stream(parser) => {
            // The stream's own error says most; then the exit status with stderr.
            if let Some(error) = parser.end.error {
                return Err(RunError::Reported(error));
            }
            if let Some(status) = exit_failure {
                return Err(RunError::Failed {
                    status,
                    stderr: stderr_text,
                });
            }
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
            (text, truncated || parser.text_cut, parser.session_id)
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
    let mut line: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut signalled = false;
    let mut drained = 0;
    let take_line =
        |line: &[u8], parser: &mut StreamParser| parser.line(&String::from_utf8_lossy(line));
    loop {
        let n = read_or_stop(&mut pipe, &mut buf, stop, &mut drained).await?;
        if n == 0 {
            break;
        }
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            let complete = chunk.last() == Some(&b'\n');
            let data = if complete {
                &chunk[..chunk.len() - 1]
            } else {
                chunk
            };
            if !skipping {
                if line.len() + data.len() > MAX_LINE {
                    tracing::warn!(
                        limit = MAX_LINE,
                        "a stream line from the agent is too long; skipping it"
                    );
                    skipping = true;
                    line.clear();
                } else {
                    line.extend_from_slice(data);
                }
            }
            if complete {
                if let (Some(asker), false) = (asker, skipping) {
                    if line.starts_with(b"HELP:") {
                        asker.ask(&String::from_utf8_lossy(&line)).await;
                        line.clear();
                        continue;
                    }
                }
                if !skipping {
                    for event in take_line(&line, &mut parser) {
                        let _ = events.send(event).await;
                    }
                    if parser.end.finished && !signalled {
                        signalled = true;
                        finished.notify_one();
                    }
                }
                line.clear();
                skipping = false;
            }
        }
    }
    if !line.is_empty() && !skipping {
        for event in take_line(&line, &mut parser) {
            let _ = events.send(event).await;
        }
    }
    for event in parser.finish() {
        let _ = events.send(event).await;
    }
    Ok(parser)
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
