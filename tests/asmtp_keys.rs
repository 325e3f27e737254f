//! An ASMTP agent's token, end to end over the ASMTP operator (tests/hosts/asmtp_operator.py):
//! an answer refused for a rotated token goes out within seconds of the new token written to
//! the file (no reload), `status` shows the refusal meanwhile, and `doctor` fails a token
//! that belongs to another agent than the mailbox's `handle`.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{AsmtpOperator as Operator, Bridge, ConfigDir};

/// The operator's admin token, for rotations.
const ADMIN: &str = "admin-secret";

/// The operator with `@alice.coder` and `@alice.boss`, which takes token rotations.
fn operator() -> Operator {
    Operator::start(&["@alice.coder", "@alice.boss"], &["--admin-token", ADMIN])
}

/// A new token for `handle` (the old one is refused from now on).
async fn rotate(operator: &Operator, handle: &str) -> String {
    let request = reqwest::Client::new()
        .post(format!(
            "{}/_admin/agents/{handle}/rotate-token",
            operator.url()
        ))
        .bearer_auth(ADMIN);
    let rotated = support::json_call(request, None).await;
    rotated["token"].as_str().unwrap().to_string()
}

/// The mailbox `coder` of `handle` with `token`, polled every 10 minutes while push is down.
fn config(operator: &Operator, handle: &str, token: &str, allow: &str) -> ConfigDir {
    operator.config_token(handle, token, allow, 600)
}

/// Issue 43: the token rotated at the operator while a task ran; its answer was refused (401)
/// and waited in the outbox. Push stayed up (its socket was opened with the old token), so no
/// read saw the refusal before the 60 s catch-up: `status` said the credentials worked, and the
/// answer went out ~40 s after the new token was written without `reload` (AMP: 2 s).
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_refused_for_a_rotated_token_goes_within_seconds_of_the_new_token_file() {
    let operator = operator();
    let dir = config(
        &operator,
        "@alice.coder",
        operator.token("@alice.coder"),
        "@alice.boss",
    );
    let gate = dir.use_gated_profile();
    let mut bridge = Bridge::start(&dir, 1);
    bridge.wait_event("mailbox.push", |e| e["connected"] == true);
    let task = operator
        .send("@alice.boss", "@alice.coder", "Task", "answered late")
        .await;
    bridge.wait_event("task.started", |_| true);
    let token = rotate(&operator, "@alice.coder").await;
    std::fs::write(&gate, "").unwrap();
    bridge.wait_event("mail.retrying", |e| e["intent"] == "task.result");
    // `status` shows the refusal, though no read was refused.
    support::poll_until("status shows the refused credentials", || {
        let status = dir.status_json();
        status["agents"][0]["link"]["credentials"]["worked"] == false
    })
    .await;
    let text = dir.run(&["status"]);
    assert!(text.contains("credentials refused"), "{text}");
    dir.replace_private("asmtp.token", &token);
    let written = Instant::now();
    while operator
        .reply_headers("@alice.boss", &task)
        .await
        .is_empty()
    {
        assert!(
            written.elapsed() < Duration::from_secs(5),
            "no answer within 5 s of the new token\n{}",
            dir.run(&["status"])
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "new token file to the refused answer: {:?}",
        written.elapsed()
    );
    assert!(!bridge.log().contains(&token), "never logged");
    assert!(bridge.stop().success());
}

/// Issue 43: `doctor` passed a token that belongs to another agent than the mailbox's
/// `handle` (the bridge then reads and answers that agent's mail, as that agent). It asks the
/// operator whose token it is (`GET /agents/me`) and fails, naming both and the fix; the
/// right token passes.
#[tokio::test(flavor = "multi_thread")]
async fn doctor_fails_a_token_of_another_agent_naming_both() {
    let operator = operator();
    let dir = config(
        &operator,
        "@alice.coder",
        operator.token("@alice.boss"),
        "@alice.boss",
    );
    let doctor = || {
        let out = std::process::Command::new(support::bin())
            .args([
                "--config",
                dir.config().to_str().unwrap(),
                "doctor",
                "--json",
            ])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let check = report
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"].as_str().unwrap_or("").contains("mailbox coder"))
            .unwrap_or_else(|| panic!("no mailbox check: {report}"))
            .clone();
        (out.status.code(), check)
    };
    let (code, check) = doctor();
    assert_ne!(code, Some(0), "{check}");
    assert_eq!(check["status"], "fail", "{check}");
    let said = check.to_string();
    assert!(
        said.contains("@alice.boss")
            && said.contains("@alice.coder")
            && said.contains("token_file"),
        "both names and the fix: {said}"
    );
    assert!(!said.contains(operator.token("@alice.boss")), "never shown");
    dir.replace_private("asmtp.token", operator.token("@alice.coder"));
    let (_, check) = doctor();
    assert_eq!(check["status"], "ok", "{check}");
}
