//! # aamp-bridge
//!
//! Connects the coding agents on a machine to mailboxes: tasks arrive as AAMP mail (ordinary
//! email with `X-AAMP-*` headers), run on an agent, and go back as mail.
//!
//! ## Architecture map
//!
//! Data flows one way, and each layer knows only its own world:
//!
//! ```text
//!     mail server (JMAP + push in, SMTP out)      AAMP service (helper API: streams, ...)
//!                 │                     ▲                      ▲
//!                 ▼                     │                      │
//!   mailbox::intake ── Inbound ──┐      │  mailbox::Outlet (backend::Backend over the agent's
//!     (a page at a time; the     │      │  back-end: rendered mail out, attachments, streams)
//!      cursor saved after)       ▼      │
//!   dispatch ── record in the journal → admit → lifecycle → record the answer → outbox
//!                                │ ▲ stream events, questions (help_needed)
//!                                ▼ │
//!   runner ── agent in its own process group: ACP session or CLI profile → answer or RunError
//! ```
//!
//! Imports run against the data's way, bottom up, and `tests/layers.rs` checks them on every
//! test run: each module below names only modules listed before it (`mailbox` and `runner`
//! never name each other, `dispatch` never names `mailbox`; the shells on top name anything),
//! and the parts of one module (its files, and its folders taken whole) never name each other
//! in a circle, of any length (`use` trees are parsed, re-exports followed).
//!
//! - [`protocol`]: the AAMP wire model, pure: intents, headers, subjects, body templates, RFC 5322
//!   rendering/reading (with attachments), timestamps, delivery status notifications
//!   (`protocol::dsn`), the unit of accounting (`protocol::Usage`) and what a result says a task
//!   cost (`protocol::usage_wire`: the `X-AAMP-Usage` header, its JSON and its line), and the
//!   delegation chain a dispatch carries (`protocol::chain`: its id, members, deadline, token
//!   budget and W3C trace context, in `X-AAMP-*` headers). It names no other module.
//! - [`config`]: the config file (read, and written back by `config::render`) and the value types
//!   it owns, among them each mailbox's keys (`config::MailboxConfig`: one type per mailbox system,
//!   holding only its keys and the few every mailbox has, read by `kind`; the kinds are listed
//!   once, in `config/mailboxes.rs`), the sender policy (`config::policy`: rules, globs, the text
//!   form, what a refused sender hears, how a cancel is answered), and each mailbox's secret
//!   (`config::secret`: one handle its clients share, read again at a reload or a refusal).
//! - [`inbound`]: the inbound model every mailbox back-end hands to dispatch (`Inbound`, `Mail`,
//!   `Reply`, `Bounce` (a delivery report), `Attachment`, and `SenderCheck`, what the back-end
//!   found about the sender). Below both `mailbox` and `dispatch`.
//! - [`backend`]: the outbound seam, also below both: [`backend::Backend`] (what dispatch asks of
//!   an agent's mailbox back-end: submit rendered mail, fetch an attachment, feed a live stream,
//!   read an earlier thread, claim a task; all but `submit` have defaults for a back-end without
//!   them), its error and the claim's outcome. Each back-end implements it in its own folder.
//! - [`error`], [`events`], [`paths`], [`fsio`], [`backoff`]: error classes, the closed set of
//!   events and their JSON lines, the state directory's layout, atomic files, the state lock and
//!   the one way to open a file an agent made (`fsio::open_inside`), the one retry schedule.
//! - [`mailbox`]: the only code that knows mail and the mailbox systems. `mailbox::open` is the one
//!   call the daemon makes: `mailbox::kinds` chooses the agent's mailbox system by its kind (one
//!   line per kind) and that system's `System` (from its folder) opens it, giving its `Outlet` (the
//!   agent's [`backend::Backend`], whatever the system) and its `Intake` (its reading loop); the
//!   types they share are `mailbox::outlet`'s. One folder per back-end, each turning its messages
//!   into the inbound model and implementing the outbound seam: `mailbox::aamp` (AAMP mail: JMAP
//!   reading from a persisted cursor in `aamp::intake` with push over WebSocket or EventSource in
//!   `aamp::push`, Inbox and address filtering, attachments, SMTP submission with Sent copies, the
//!   AAMP service's helper API, sender authenticity in `aamp::auth` with `Received:` fields read by
//!   their grammar in `aamp::received`, failing closed, plain replies and delivery reports, claims
//!   on dispatches when several bridges serve one mailbox in `aamp::claims`, the outbound seam in
//!   `aamp::outlet`, what `doctor` and `init` check of a mailbox in `aamp::probe` (each part a
//!   `mailbox::Finding`, which `mailbox::check` gives for every kind), the person's own `dispatch`
//!   in `aamp::dispatcher`), `mailbox::asmtp` (an ASMTP operator: push, keyset catch-up, reply
//!   envelopes with client ids), `mailbox::amp` (an AMP broker, polled; answers as replies in the
//!   thread) and `mailbox::samp` (an Agent Mailbox server over MCP: its own small JSON-RPC client
//!   in `samp::rpc`, tool arguments mapped from the schemas the server lists in `samp::tools`,
//!   messages journaled before they are acked, sends paced to the server's rate, the answers the
//!   server confirmed kept so a lost confirmation never sends one twice), all three shaped
//!   `client`, `wire`, `intake`, `replies` and sharing `mailbox::answer` (an answer's text); each
//!   marks the bridge's answers in its own metadata so an answer never starts a task. Shared by
//!   all: `mailbox::intake` (the one reading loop `watch`, `Health`, the one rule for a mailbox's
//!   link state, refused keys and retries, and the one push supervisor `supervise_push` over each
//!   pushed back-end's connection, run beside the loop by `watch_pushed`), HTTP clients, errors,
//!   the link state a status command reads, and the questions an agent posted where replies link by
//!   the back-end's own id (`mailbox::Questions`, kept on disk). It never names `dispatch` or
//!   `runner`.
//! - [`runner`]: the only code that knows agents: ACP sessions (`runner::acp`, where
//!   `runner::acp::gate` decides every action an agent asks of the bridge by the one policy:
//!   permission requests, terminals, file writes and reads), CLI profiles (`runner::profile`, which
//!   owns the permission policy both kinds apply) and their stream formats (`runner::stream`),
//!   templates, process groups and tagged leftovers (`runner::process`), the MCP server a task's agent is
//!   given (`runner::McpServer`: ACP `mcpServers`, a CLI profile's `mcp_args`), each agent's usage
//!   reports (`runner::stream::usage`, `runner::acp::usage`) and its usage limit told apart from
//!   a failure in its own words (`runner::limit`), the agent scan
//!   (`runner::scan`) and the one login check (`runner::login`, read as each agent reads it, for
//!   `agents`, `doctor`, `init` and `status`). It names only the bottom modules.
//! - [`dispatch`]: what to do with a message: the task journal (`dispatch::journal`, SQLite: what
//!   was received, decided, run and answered, and the outbox of mail to send), sender policy
//!   applied (from `config::policy`, plus rules kept in the journal and pairing), limits and loop
//!   guards, budgets in tokens and money with the price table (`dispatch::budget`: a report
//!   priced before it is journaled, a task over budget refused, a hard budget's run stopped),
//!   de-duplication, expiry, a slot scheduler by priority and arrival, one task at a time
//!   per conversation (a sender's Session-Key), the lifecycle, recovery at start, cancel, claims
//!   (one of several bridges runs a task only once it won its claim, through [`backend::Backend`]),
//!   each conversation's turns (given as text to an agent that lost its session), questions to the
//!   dispatcher, the prompt, and what a result carries (`dispatch::results`: fields and files from
//!   the workspace only), and delegations (`dispatch::delegations`: a running task's sub-tasks
//!   sent by mail from its agent's mailbox, journaled before they leave, their answers taken
//!   once; the grants binding the tools to the one task that runs). Pure where it can be ([`dispatch::admit`], [`config::policy`],
//!   [`dispatch::results::extract`]); answers leave as rendered bytes through [`backend::Backend`].
//!   One agent's [`dispatch::Engine`] keeps the task's path (routing, the runs, the lifecycle's
//!   five steps, recovery, pairing); its long-lived parts are types of their own, each in its file
//!   with its own state: the [`dispatch::Outbox`] (answers composed, queued and sent by its
//!   worker), the [`dispatch::Claims`] (claims among replicas), the [`dispatch::Desk`]
//!   (questions and the operator's acts: what mail answers and the live view reach) and each
//!   agent's usage-limit gate (`dispatch::quota`: a task whose agent hit its limit parked and
//!   journaled, the agent's queue held until the reset, then let through one at a time). It names
//!   `runner`, `inbound` and `backend`, never `mailbox`.
//! - [`ui`]: the live view in the browser (`[ui]`): an HTTP server of one static page and one feed
//!   of the bridge's events (the [`events::tap`]; its token a header, never a cookie), the read
//!   model `status`, `tasks` and `task show` share (`ui::snapshot`), the usage sums the `usage`
//!   report, `status` and the page read from the journal's hours (`ui::usage`), and the operator's answers and
//!   cancels, taken through the engines' own paths (their [`dispatch::Desk`]). It names neither
//!   `daemon` nor the shells; the daemon starts it.
//! - [`daemon`]: wires the layers: the state directory's lock and journal, per agent an intake, an
//!   engine (`dispatch::Engine`) and its outbox's worker (`dispatch::Outbox::run`) over the
//!   `mailbox::Outlet` that `mailbox::open` gave (no arm per kind of mailbox); stop, abort and
//!   reload from its caller (`daemon::Controls`; the binary ties them to signals); the owner-only
//!   control socket `status` asks.
//! - [`delegate`]: the MCP server the bridge gives each agent it runs: `delegate::stdio` (the
//!   `aamp-bridge mcp` command, on the official SDK `rmcp`) relays each tool call over the
//!   state directory's socket to `delegate::relay` in the daemon, which checks the task's
//!   credential and that the caller is one of the task's processes, and hands the call to the
//!   agent's engine (`dispatch::delegations`). A shell: the daemon and `cli` start it.
//! - [`cli`], [`wizard`], [`service`], [`telemetry`]: thin shells (printing that a closed stdout or
//!   stderr never turns into a panic, `output`, which `cli` and `wizard` share; the commands;
//!   `init`, its answers and `import`, turned into a config by `wizard::apply`, and the
//!   profile-maker, with the only prompts in the crate in `wizard::prompt`; the systemd unit and
//!   launchd agent; logging).

pub mod backend;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod delegate;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod fsio;
pub mod inbound;
pub mod mailbox;
pub(crate) mod output;
pub mod paths;
pub mod protocol;
pub mod runner;
pub mod service;
pub mod telemetry;
pub mod ui;
pub mod wizard;
